"""The benchmark canary: a fixed set of stored completions scored by today's verifiers each iteration.

The set is the first ``monitors.canary_per_env`` benchmark tasks of each environment (by task id),
each with its reference completion and a blank one. The benchmark never changes between iterations
and neither do these completions, so a canary reward that moves means a verifier changed, not the
model: the ``canary`` monitor compares these rows with the previous iterations' (closedloop.monitors).

Pure apart from the verifiers it is handed (an EnvPools), like rewards/hacks.py check_known_hacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from closedloop.envs import EnvironmentError_
from closedloop.envs.base import Task
from closedloop.io import read_jsonl, say
from closedloop.rewards.combine import combine
from closedloop.workspace import CANARY_CHECK  # noqa: F401  (its readers import it from here)

KINDS = ("reference", "blank")  # the reference must keep scoring 1.0, the blank one 0


def canary_set(benchmark_tasks: list[Mapping[str, Any]], per_env: int) -> list[tuple[str, str, dict, str, str]]:
    """(canary_id, env, task record, kind, completion) for the first ``per_env`` tasks of each
    environment by task id, reference then blank, environments sorted: the same list for the same
    benchmark whatever order its file lists the tasks in."""
    if per_env < 0:
        raise ValueError(f"monitors.canary_per_env must be >= 0, got {per_env}")
    by_env: dict[str, list[Mapping[str, Any]]] = {}
    for task in benchmark_tasks:
        by_env.setdefault(task["env"], []).append(task)
    canary = []
    for env, tasks in sorted(by_env.items()):
        for task in sorted(tasks, key=lambda t: t["task_id"])[:per_env]:
            for kind, completion in (("reference", task["reference"]), ("blank", "")):
                canary.append((f"{task['task_id']}#{kind}", env, dict(task), kind, completion))
    return canary


def benchmark_records(path: Path) -> list[dict[str, Any]]:
    """The benchmark tasks the canary is drawn from. A workspace without a benchmark yet (a stage run on
    its own, outside the pipeline, whose dvc.yaml makes the file a dep of the reward stage) has no
    canary: said on stderr, and the canary monitor then says it was skipped."""

    if not Path(path).exists():
        say(f"closedloop: warning: {path} not found: no benchmark canary this time")
        return []
    return read_jsonl(path, required=("task_id", "env", "reference"))


def check_canary(canary: list[tuple[str, str, dict, str, str]], verifiers: Any,
                 weights_of: Callable[[Any], Mapping[str, float]],
                 version_of: Callable[[str, Any], str]) -> list[dict[str, Any]]:
    """One row per canary completion (data/batch/canary_check.jsonl): its reward by the environment's
    verifier weights (no human component: the question is what the verifier says), verdict, status and
    the verifier's version. ``verifiers`` is an EnvPools; ``weights_of(env)`` and
    ``version_of(name, env)`` as for check_known_hacks. A canary of an environment params.yaml no longer
    knows is ``skipped`` with no reward (nothing to compare it with)."""

    by_env: dict[str, list[tuple]] = {}
    for entry in canary:
        by_env.setdefault(entry[1], []).append(entry)
    rows: dict[str, dict[str, Any]] = {}
    fields = tuple(Task.__dataclass_fields__)  # a record may carry more than a Task has
    for env_name, entries in sorted(by_env.items()):
        try:
            env = verifiers.env(env_name)
        except EnvironmentError_:
            for canary_id, _, task, kind, _ in entries:
                rows[canary_id] = {**_identity(canary_id, env_name, task, kind), "reward": None, "passed": None,
                                   "status": "skipped", "verifier": f"verifier:{env_name}",
                                   "verifier_version": None, "components": {}}
            continue
        tasks = [Task.from_record({k: task[k] for k in fields}) for _, _, task, _, _ in entries]
        verdicts = verifiers.verify_batch(env_name, tasks, [completion for *_, completion in entries])
        weights, version = weights_of(env), version_of(env_name, env)
        for (canary_id, _, task, kind, _), verdict in zip(entries, verdicts):
            rows[canary_id] = {**_identity(canary_id, env_name, task, kind),
                               "reward": round(combine(verdict.components, weights), 6),
                               "passed": bool(verdict.passed), "status": verdict.status,
                               "verifier": f"verifier:{env_name}", "verifier_version": version,
                               "components": verdict.components}
    return [rows[entry[0]] for entry in canary]  # in the set's order


def canary_figures(rows: list[dict[str, Any]], seconds: float | None = None) -> dict[str, Any]:
    """Numbers only, for metrics/reward.json: how many, the mean reward per kind, and (given the
    seconds the check took) its throughput ``verifications_per_s``, which run_stage moves to the
    timing file with the other clock figures (stage_files.split_rates)."""
    figures: dict[str, Any] = {"total": len(rows)}
    if seconds is not None and rows:
        figures["verifications_per_s"] = round(len(rows) / max(seconds, 1e-9), 2)
    for kind in KINDS:
        rewards = [r["reward"] for r in rows if r["kind"] == kind and r["reward"] is not None]
        figures[f"{kind}_mean"] = round(sum(rewards) / len(rewards), 6) if rewards else 0.0
    figures["skipped"] = sum(1 for r in rows if r["status"] == "skipped")
    return figures


def _identity(canary_id: str, env: str, task: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return {"canary_id": canary_id, "env": env, "task_id": task["task_id"], "kind": kind}
