"""Grading: positive / partial / error buckets, failure→fix pairs, and the training set they make."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from closedloop.models.prompts import Prompt, episode_prompt, prompt_key

POSITIVE, PARTIAL, ERROR = "positive", "partial", "error"
BUCKETS = (POSITIVE, PARTIAL, ERROR)


def bucket_of(tests_passed: int, tests_total: int) -> str:
    """All tests pass → positive; some → partial; none (or it crashed before any) → error."""
    if tests_total > 0 and tests_passed >= tests_total:
        return POSITIVE
    if tests_passed > 0:
        return PARTIAL
    return ERROR


def fix_prompt(task_prompt: str, failed_completion: str, feedback: str) -> str:
    """The prompt of a failure→fix pair: the failed attempt, its feedback, then the task again.

    The target is a passing completion of the same task, so the model learns to answer feedback.
    """
    return episode_prompt(task_prompt, [(failed_completion, feedback)])


@dataclass(frozen=True)
class FixPair:
    pair_id: str
    task_id: str
    failed_sample_id: str
    fixed_sample_id: str
    prompt: str
    completion: str


def build_fix_pairs(graded: list[dict[str, Any]], prompts: dict[str, str], per_task: int) -> list[FixPair]:
    """Pair failed samples with passing samples of the same task.

    Deterministic: samples are taken in sample order; each failed completion is used once, paired
    with the passing completions in turn so the targets vary when there are several.
    """
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in graded:
        by_task[row["task_id"]].append(row)
    pairs: list[FixPair] = []
    for task_id in sorted(by_task):
        rows = sorted(by_task[task_id], key=lambda r: r["sample_index"])
        passing = _distinct(r for r in rows if r["bucket"] == POSITIVE and not r.get("human_veto", False))
        failing = _distinct(r for r in rows if r["bucket"] != POSITIVE and r["status"] != "infra_error")
        if not passing:
            continue
        for n, failed in enumerate(failing[:per_task]):
            fixed = passing[n % len(passing)]
            pairs.append(
                FixPair(
                    pair_id=f"{failed['sample_id']}->{fixed['sample_id']}",
                    task_id=task_id,
                    failed_sample_id=failed["sample_id"],
                    fixed_sample_id=fixed["sample_id"],
                    prompt=fix_prompt(prompts[task_id], failed["completion"], failed["feedback"]),
                    completion=fixed["completion"],
                )
            )
    return pairs


def _distinct(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for row in rows:
        if row["completion"] not in seen:
            seen.add(row["completion"])
            out.append(row)
    return out


def training_records(
    graded: list[dict[str, Any]],
    prompts: dict[str, str],
    fixes: list[FixPair],
    *,
    include_fixes: bool,
    max_fix_fraction: float,
    max_task_pass_rate: float = 1.0,
    references: dict[str, str] | None = None,
    episode_prompts: dict[str, Prompt] | None = None,
) -> list[dict[str, Any]]:
    """Positives (one per distinct completion of a task), the references of unsolved tasks, and,
    optionally, capped fix pairs.

    Positives come only from tasks whose samples passed at most ``max_task_pass_rate`` of the time:
    a task the policy already solves every time teaches it nothing new. ``references`` ({task id:
    reference}) are used only for tasks no sample solved: there rejection sampling has nothing to
    keep, and the task's known-good answer is the one signal the batch holds (STaR's fallback).
    ``episode_prompts`` ({sample id: transcript}): a positive that ended a multi-round episode is
    learnt conditioned on the transcript its final attempt was sampled on, so the policy learns to
    correct itself from the feedback it was shown.
    """
    samples: dict[str, int] = defaultdict(int)
    passes: dict[str, int] = defaultdict(int)
    for row in graded:
        samples[row["task_id"]] += 1
        passes[row["task_id"]] += row["bucket"] == POSITIVE
    records = []
    seen: set[tuple[str, str, str]] = set()
    for row in sorted(graded, key=lambda r: r["sample_id"]):
        prompt = (episode_prompts or {}).get(row["sample_id"], prompts[row["task_id"]])
        key = (row["task_id"], prompt_key(prompt), row["completion"])
        frontier = passes[row["task_id"]] <= max_task_pass_rate * samples[row["task_id"]] + 1e-9
        vetoed = row.get("human_veto", False)  # a pass people rejected (stages/grade.py) is not learnt
        if row["bucket"] == POSITIVE and frontier and key not in seen and not vetoed:
            seen.add(key)
            records.append(
                {"source": "positive", "task_id": row["task_id"], "origin": row["sample_id"],
                 "prompt": prompt, "completion": row["completion"]}
            )
    positives = len(records)
    for task_id in sorted(samples):
        reference = (references or {}).get(task_id)
        if reference and passes[task_id] == 0:
            records.append(
                {"source": "unsolved", "task_id": task_id, "origin": task_id,
                 "prompt": prompts[task_id], "completion": reference}
            )
    if include_fixes and fixes and max_fix_fraction > 0:
        # fixes / (positives + fixes) <= max_fix_fraction
        cap = len(fixes) if max_fix_fraction >= 1 else int(positives * max_fix_fraction / (1 - max_fix_fraction))
        for pair in fixes[:cap]:
            records.append(
                {"source": "fix", "task_id": pair.task_id, "origin": pair.pair_id,
                 "prompt": pair.prompt, "completion": pair.completion}
            )
    return records


def bucket_counts(graded: list[dict[str, Any]]) -> dict[str, int]:
    counts = {bucket: 0 for bucket in BUCKETS}
    for row in graded:
        counts[row["bucket"]] += 1
    return counts


def fix_pair_record(pair: FixPair) -> dict[str, Any]:
    return asdict(pair)
