"""The review sample: which of a batch's graded samples a person is asked to score.

Drawn evenly over environment × bucket first (so every environment and every kind of outcome is
seen), then the disagreements, where the automatic verdict is most likely wrong. Pure and seeded:
the same batch and seed give the same sample, so the grade stage stays reproducible under DVC.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from typing import Any, Iterable, Mapping

from closedloop.grading import BUCKETS

# Why a sample was drawn, in the order strata are filled (the first that applies is recorded).
STRATA = ("env_bucket", "partial_failed", "validators_disagree", "near_threshold")


def completion_sha256(completion: str) -> str:
    return hashlib.sha256(completion.encode("utf-8")).hexdigest()


def partial_failed(reward: Mapping[str, Any]) -> bool:
    """Partial credit with a failed verdict: some reward, yet the verifier said fail."""
    return reward["reward"] > 0 and not reward["passed"]


def validators_disagree(components: Mapping[str, float | None]) -> bool:
    """Two reward components that applied say opposite things outright: one is 1, another 0.

    Only the extremes count; 0.5 from one validator beside 1 from another is graded credit, not a
    contradiction. (A format check at 1 with tests at 0 is the typical case: well-formed, wrong.)"""
    values = [v for v in components.values() if v is not None]
    return any(v >= 1 for v in values) and any(v <= 0 for v in values)


def near_threshold(reward: float, threshold: float, margin: float) -> bool:
    return abs(reward - threshold) <= margin


def draw(graded: Iterable[Mapping[str, Any]], rewards: Mapping[str, Mapping[str, Any]],
         tasks: Mapping[str, Mapping[str, Any]], strata: Any, size: int, seed: int,
         iteration: int) -> list[dict[str, Any]]:
    """The review sample rows (see ``review_row``), at most ``size``, no sample twice.

    ``graded``: rows of graded.jsonl (bucket, reward, status...); ``rewards``: rewards.jsonl rows by
    sample id (components, steps, passed); ``tasks``: task records by task id; ``strata``: a
    ``ReviewStrata`` (per_env_bucket, partial_failed, validators_disagree, near_threshold,
    threshold, margin). Candidates are sorted by sample id before each seeded draw, so the input
    order does not matter."""
    rows = sorted(graded, key=lambda row: row["sample_id"])
    rng = random.Random(seed)
    chosen: dict[str, str] = {}  # sample id → stratum, in draw order

    def take(candidates: list[Mapping[str, Any]], count: int, stratum: str) -> None:
        free = [row for row in candidates if row["sample_id"] not in chosen]
        for row in rng.sample(free, min(count, len(free), size - len(chosen))):
            chosen[row["sample_id"]] = stratum

    groups: dict[tuple[str, str], list] = defaultdict(list)
    for row in rows:
        groups[(row["env"], row["bucket"])].append(row)
    order = {bucket: i for i, bucket in enumerate(BUCKETS)}
    for key in sorted(groups, key=lambda k: (k[0], order.get(k[1], len(order)), k[1])):
        take(groups[key], strata.per_env_bucket, "env_bucket")
    take([r for r in rows if partial_failed(rewards[r["sample_id"]])], strata.partial_failed, "partial_failed")
    take([r for r in rows if validators_disagree(rewards[r["sample_id"]]["components"])],
         strata.validators_disagree, "validators_disagree")
    take([r for r in rows if near_threshold(r["reward"], strata.threshold, strata.margin)],
         strata.near_threshold, "near_threshold")
    by_id = {row["sample_id"]: row for row in rows}
    return [review_row(by_id[sample_id], rewards[sample_id], tasks[by_id[sample_id]["task_id"]], stratum, iteration)
            for sample_id, stratum in chosen.items()]


def review_row(graded: Mapping[str, Any], reward: Mapping[str, Any], task: Mapping[str, Any], stratum: str,
               iteration: int) -> dict[str, Any]:
    """One row of data/batch/review_sample.jsonl: everything a reviewer sees, and everything a label
    needs to apply to a later batch (task id and completion hash) or to re-verify a hack (the task)."""
    return {
        "sample_id": graded["sample_id"], "task_id": graded["task_id"], "env": graded["env"],
        "slice": graded["slice"], "bucket": graded["bucket"], "stratum": stratum,
        "prompt": task["prompt"], "completion": graded["completion"],
        "completion_sha256": completion_sha256(graded["completion"]),
        "model_version": graded["model_version"], "iteration": iteration, "task": dict(task),
        "verifier": {"passed": bool(reward["passed"]), "reward": float(reward["reward"]), "status": reward["status"],
                     "components": dict(reward["components"]), "steps": dict(reward["steps"]),
                     "feedback": reward.get("feedback", "")},
    }
