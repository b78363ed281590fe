"""Known reward hacks: completions a reviewer labelled ``reward_hacking``, which every later verifier
version must fail. The reward stage re-verifies each one with today's verifiers (its row carries the
task record and the completion, so the check outlives the batch it came from); the gate holds while
the verifier passes any of them, or could not judge one at all. Each one's reward is reported too
(``scoring_above_zero``): partial credit a hack still earns is what issue-16-style fixes drive to 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from closedloop.envs import EnvironmentError_
from closedloop.envs.base import Task
from closedloop.io import json_objects
from closedloop.rewards.combine import combine
from closedloop.workspace import KNOWN_HACKS_CHECK  # noqa: F401  (its readers import it from here)

REQUIRED = ("answer_id", "sample_id", "env", "task", "completion")


class KnownHacksError(ValueError):
    """A known-hacks row cannot be re-verified as written; the message names file, line and field."""


def read_known_hacks(path: Path) -> list[dict[str, Any]]:
    """The known hacks of ``path`` (none when it does not exist yet), checked; a repeated ``answer_id``
    counts once."""

    path = Path(path)
    if not path.exists():
        return []
    task_fields = set(Task.__dataclass_fields__)
    hacks, seen = [], set()
    for where, row in json_objects(path.read_text(encoding="utf-8").splitlines(), path, KnownHacksError):
        missing = [key for key in REQUIRED if key not in row]
        if missing:
            raise KnownHacksError(f"{where}: missing field(s) {', '.join(missing)}")
        if not isinstance(row["completion"], str):
            raise KnownHacksError(f"{where}: field 'completion' must be a string, got {type(row['completion']).__name__}")
        task = row["task"]
        if not isinstance(task, dict) or task_fields - set(task):
            lacking = sorted(task_fields - set(task)) if isinstance(task, dict) else sorted(task_fields)
            raise KnownHacksError(f"{where}: field 'task' must be the full task record "
                                  f"(as in data/batch/tasks.jsonl); it lacks {lacking}")
        if task["env"] != row["env"]:
            raise KnownHacksError(f"{where}: field 'env' is {row['env']!r} but its task's env is {task['env']!r}")
        if row["answer_id"] not in seen:
            seen.add(row["answer_id"])
            hacks.append(row)
    return hacks


def check_known_hacks(hacks: list[dict[str, Any]], verifiers: Any,
                      weights_of: Callable[[Any], Mapping[str, float]],
                      version_of: Callable[[str, Any], str]) -> list[dict[str, Any]]:
    """One row per known hack: today's verdict, its reward by the environment's verifier weights (no
    human component: the question is whether the verifier alone is fooled), and whether it holds the
    gate (``holds``: a passing verdict, or one that is not a judgement, e.g. a sandbox failure).

    ``verifiers`` is an EnvPools; ``weights_of(env)`` and ``version_of(name, env)`` give an
    environment's verifier weights and version. A hack of an environment params.yaml no longer
    knows is reported ``skipped``: the loop cannot produce it any more, and it holds nothing.
    """

    by_env: dict[str, list[dict]] = {}
    for hack in hacks:
        by_env.setdefault(hack["env"], []).append(hack)
    rows = {}
    for env_name, env_hacks in sorted(by_env.items()):
        try:
            env = verifiers.env(env_name)
        except EnvironmentError_ as error:
            for hack in env_hacks:
                rows[hack["answer_id"]] = {**_identity(hack), "verifier": f"verifier:{env_name}",
                                           "verifier_version": None, "status": "skipped", "skipped": str(error),
                                           "reward": None, "passed": None, "components": {}, "holds": False}
            continue
        fields = tuple(Task.__dataclass_fields__)  # a record may carry more than a Task has
        tasks = [Task.from_record({k: h["task"][k] for k in fields}) for h in env_hacks]
        verdicts = verifiers.verify_batch(env_name, tasks, [h["completion"] for h in env_hacks])
        weights, version = weights_of(env), version_of(env_name, env)
        for hack, verdict in zip(env_hacks, verdicts):
            reward = round(combine(verdict.components, weights), 6)
            rows[hack["answer_id"]] = {
                **_identity(hack), "verifier": f"verifier:{env_name}", "verifier_version": version,
                "status": verdict.status, "passed": verdict.passed, "components": verdict.components,
                # It holds the gate while the verifier still accepts it (or cannot judge it). Its
                # reward is reported as well, but partial credit alone does not hold: a well-formed,
                # runnable code answer earns the syntax and runs components (0.2 of the code weights)
                # under any verifier, and holding on that would hold every later gate for good.
                "reward": reward, "holds": bool(verdict.passed) or verdict.status == "infra_error"}
    return [rows[hack["answer_id"]] for hack in hacks]  # in the file's order


def hack_figures(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Numbers only, for metrics/reward.json."""
    return {"total": len(rows),
            "scoring_above_zero": sum(1 for r in rows if r["reward"] is not None and r["reward"] > 0),
            "not_judged": sum(1 for r in rows if r["status"] == "infra_error"),
            "skipped": sum(1 for r in rows if r["status"] == "skipped")}


def _identity(hack: Mapping[str, Any]) -> dict[str, Any]:
    return {"answer_id": hack["answer_id"], "sample_id": hack["sample_id"], "task_id": hack["task"]["task_id"],
            "env": hack["env"], "iteration": hack.get("iteration"), "reviewer": hack.get("reviewer")}
