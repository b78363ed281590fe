"""An environment's verifier as a feedback source: its components, and the verdict fields every
reward row carries (status, passed, feedback, failed_step, steps)."""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from closedloop.envs.base import Task
from closedloop.rewards.feedback import Feedback, Scores


class VerifierSource:
    """Environment ``env_name``'s verifier over the samples of that environment.

    ``verifiers`` is what starts and holds the sandbox pools (closedloop.rewards.pools.EnvPools, or
    anything with ``env(name)`` and ``verify_batch(name, tasks, completions)``); this source only asks
    it for verdicts, so the pools stay in the stage that owns them.
    """

    def __init__(self, env_name: str, verifiers: Any, version: str, component_versions: Mapping[str, str]) -> None:
        self.env_name = env_name
        self.verifiers = verifiers
        self.name = f"verifier:{env_name}"
        self.components = tuple(verifiers.env(env_name).components)
        self.version = version
        self.component_versions = dict(component_versions)

    def score(self, tasks: Mapping[str, dict], samples: Sequence[dict]) -> Scores:
        return self.feedback(tasks, samples).components

    def feedback(self, tasks: Mapping[str, dict], samples: Sequence[dict]) -> Feedback:
        mine = [s for s in samples if s["env"] == self.env_name]
        started = time.perf_counter()
        verdicts = self.verifiers.verify_batch(self.env_name, [Task.from_record(tasks[s["task_id"]]) for s in mine],
                                               [s["completion"] for s in mine])
        seconds = time.perf_counter() - started
        result = Feedback(components={}, figures={
            "verifications_per_s": {self.env_name: round(len(mine) / seconds, 1) if seconds else 0.0}},
            sources={self.name: self.version, **{f"component:{self.env_name}/{name}": version
                                                 for name, version in self.component_versions.items()}})
        for sample, verdict in zip(mine, verdicts):
            sample_id = sample["sample_id"]
            # Every component stays, None included: an environment's rows always list its components.
            result.components[sample_id] = dict(verdict.components)
            result.fields[sample_id] = {"status": verdict.status, "passed": verdict.passed,
                                        "feedback": verdict.feedback, "failed_step": verdict.failed_step,
                                        "steps": verdict.steps}
            # The sources of this sample's reward: the verifier and each of its components that applied.
            result.named[sample_id] = {self.name: self.version, **{
                f"component:{self.env_name}/{name}": self.component_versions[name]
                for name, value in verdict.components.items() if value is not None}}
        return result
