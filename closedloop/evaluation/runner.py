"""Run a policy on benchmark tasks and score it: the measurement the gate compares."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from closedloop.config import Params
from closedloop.envs.base import Task
from closedloop.envs.episodes import episode_checks
from closedloop.evaluation.stats import summarize
from closedloop.execution.local import LocalExecutor
from closedloop.models.loading import model_fingerprint
from closedloop.sampling.episodes import Episode, run_episodes
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

    rounds = params.sample.rounds
    if rounds > 1:
        run = run_episodes(executor or LocalExecutor(), params, model_dir, tasks, k=samples_per_task, seed=seed,
                           batch_size=batch_size, rounds=rounds, verifiers=verifiers, progress=progress)
        hidden = hidden_verdicts(run.episodes, verifiers)
        by_round, stats = passes_by_round(run.episodes, rounds, hidden), run.stats
        passes = by_round[-1]
    else:
        sampled = sample_sharded(executor or LocalExecutor(), params, model_dir, [task.prompt for task in tasks],
                                 [t.task_id for t in tasks], k=samples_per_task, seed=seed, batch_size=batch_size,
                                 progress=progress)
        stats = sampled.stats
        passes = verify_grouped(tasks, sampled.generations, verifiers)
    per_task = _per_task(tasks, samples_per_task, passes)
    result = {
        "model_version": model_fingerprint(Path(model_dir)),
        "samples_per_task": samples_per_task,
        "summary": summarize(per_task),
        "per_task": {item["task_id"]: item["c"] for item in per_task},
        "generation": {"tokens_per_s": stats.tokens_per_s, "samples_per_s": stats.samples_per_s},
    }
    if rounds > 1:
        # The gate decides on "summary" (after all rounds); each round's figures and the correction rate
        # stand beside it.
        result["rounds"] = {"by_round": [summarize(_per_task(tasks, samples_per_task, p)) for p in by_round],
                            "per_task_by_round": by_round,
                            "correction_rate": correction_rate(hidden),
                            "per_round": run.per_round}
    return result


def _per_task(tasks: list[Task], n: int, passes: dict[str, int]) -> list[dict]:
    return [{"task_id": t.task_id, "env": t.env, "slice": t.slice, "n": n, "c": passes[t.task_id]} for t in tasks]


def hidden_verdicts(episodes: list[list[Episode]], verifiers: Any) -> dict[tuple[int, int], list[bool]]:
    """Each episode's attempts on the hidden checks (the checks the reward and the benchmark count),
    by (task position, episode index)."""
    hidden = {row[0].task.task_id: episode_checks(verifiers.env(row[0].task.env), row[0].task).hidden
              for row in episodes if row}
    verifiers.prefetch((e.task.env, hidden[e.task.task_id], a.completion.text)
                       for row in episodes for e in row for a in e.attempts)
    found = {}
    for i, row in enumerate(episodes):
        for e in row:
            verdicts = verifiers.verify_batch(e.task.env, [hidden[e.task.task_id]] * len(e.attempts),
                                              [a.completion.text for a in e.attempts])
            found[(i, e.index)] = [bool(v.passed) for v in verdicts]
    return found


def passes_by_round(episodes: list[list[Episode]], rounds: int,
                    verdicts: dict[tuple[int, int], list[bool]]) -> list[dict[str, int]]:
    """Passing episodes per task after 1, 2, ..., ``rounds`` rounds (``verdicts``: hidden_verdicts'): an
    episode that stopped early keeps its last attempt for the rounds it did not use."""
    out = []
    for r in range(1, rounds + 1):
        out.append({row[0].task.task_id: sum(verdicts[(i, e.index)][min(r, len(e.attempts)) - 1] for e in row)
                    for i, row in enumerate(episodes) if row})
    return out


def correction_rate(verdicts: dict[tuple[int, int], list[bool]]) -> dict[str, float]:
    """Of the episodes whose first attempt failed the hidden checks, the share whose final attempt passed."""
    failed_first = [v for v in verdicts.values() if not v[0]]
    fixed = sum(v[-1] for v in failed_first)
    return {"failed_first": len(failed_first), "fixed": fixed,
            "rate": fixed / len(failed_first) if failed_first else 0.0}


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
