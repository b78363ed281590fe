"""Run a policy on benchmark tasks and score it: the measurement the gate compares."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from closedloop.config import Params
from closedloop.envs.base import Task
from closedloop.evaluation.stats import summarize
from closedloop.execution.local import LocalExecutor
from closedloop.models.loading import model_fingerprint
from closedloop.sampling.shards import sample_sharded


def evaluate_policy(
    model_dir: Path,
    tasks: list[Task],
    *,
    params: Params,
    samples_per_task: int,
    seed: int,
    batch_size: int,
    verifiers: Any,
    progress: bool = False,
    executor: Any = None,
) -> dict[str, Any]:
    """pass@1 over ``samples_per_task`` samples per task, overall and per env/slice.

    Champion and candidate are evaluated with the same seed and settings, so the comparison is paired.
    The completions come from the sampler ``params.sample.backend`` names (see sampling/base.py), in
    shards on ``executor``'s workers (None: in this process, as one shard).
    """

    sampled = sample_sharded(executor or LocalExecutor(), params, model_dir, [task.prompt for task in tasks],
                             [t.task_id for t in tasks], k=samples_per_task, seed=seed, batch_size=batch_size,
                             progress=progress)
    generations, stats = sampled.generations, sampled.stats
    passes = verify_grouped(tasks, generations, verifiers)
    per_task = [
        {"task_id": t.task_id, "env": t.env, "slice": t.slice, "n": samples_per_task, "c": passes[t.task_id]}
        for t in tasks
    ]
    return {
        "model_version": model_fingerprint(Path(model_dir)),
        "samples_per_task": samples_per_task,
        "summary": summarize(per_task),
        "per_task": {item["task_id"]: item["c"] for item in per_task},
        "generation": {"tokens_per_s": stats.tokens_per_s, "samples_per_s": stats.samples_per_s},
    }


def verify_grouped(tasks: list[Task], generations, verifiers: Any) -> dict[str, int]:
    """Count passing samples per task, verifying each environment's samples in one batch
    (``verifiers``: a closedloop.rewards.pools.EnvPools, or anything with its verify_batch)."""
    by_env: dict[str, list[tuple[Task, str]]] = defaultdict(list)
    for task, samples in zip(tasks, generations):
        for sample in samples:
            by_env[task.env].append((task, sample.text))
    passes = {task.task_id: 0 for task in tasks}
    # Every environment's verifications at once, where the verifiers can run them side by side.
    verifiers.prefetch((env_name, task, text) for env_name, items in by_env.items() for task, text in items)
    for env_name, items in by_env.items():
        verdicts = verifiers.verify_batch(env_name, [t for t, _ in items], [c for _, c in items])
        for (task, _), verdict in zip(items, verdicts):
            passes[task.task_id] += int(verdict.passed)
    return passes
