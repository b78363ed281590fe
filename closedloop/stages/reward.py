"""Stage reward: every sample scored by its feedback sources (its environment's verifier, in the
sandbox where it runs code; the human review labels; the user's sources in params.yaml), components
kept apart, combined by the environment's weights, each row naming the sources and versions that
produced it. Then every known reward hack is re-verified with today's verifiers, for the gate."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from closedloop.envs import reward_weights
from closedloop.envs.base import Task, load_tasks
from closedloop.execution.factory import open_executor
from closedloop.io import read_jsonl, write_jsonl
from closedloop.nested import deep_merge
from closedloop.rewards.canary import benchmark_records, canary_figures, canary_set, check_canary
from closedloop.rewards.feedback import FeedbackSourceError
from closedloop.rewards.hacks import (
    KNOWN_HACKS_CHECK,
    KnownHacksError,
    check_known_hacks,
    hack_figures,
    read_known_hacks,
)
from closedloop.rewards.human import LabelsError
from closedloop.rewards.scoring import score_batch
from closedloop.rewards.sources import feedback_sources, verifier_version
from closedloop.rewards.verification import ShardedVerifiers
from closedloop.stages.common import StageContext, StageError


def run(ctx: StageContext) -> dict:
    tasks = {task.task_id: task.to_record() for task in load_tasks(ctx.ws.tasks)}
    samples = read_jsonl(ctx.ws.samples, required=("sample_id", "task_id", "env", "completion"))
    unknown = sorted({s["task_id"] for s in samples} - set(tasks))
    if unknown:
        raise StageError(f"{ctx.ws.samples}: samples for tasks not in {ctx.ws.tasks}: {unknown[:3]}")
    try:
        hacks = read_known_hacks(ctx.ws.known_hacks)
        versions = feedback_sources(ctx.params)
    except (KnownHacksError, FeedbackSourceError) as error:
        raise StageError(str(error)) from None
    env_names = sorted({s["env"] for s in samples})

    def weights_of(env):
        return reward_weights(env, ctx.params)

    def version_of(name, env):
        return verifier_version(name, env, ctx.params)

    fixed = canary_set(benchmark_records(ctx.ws.benchmark_tasks), ctx.params.monitors.canary_per_env)
    # The batch's sandboxed verifications run in shards on the executor (execution.backend), every
    # environment's side by side; scoring reads their verdicts. The known hacks and the canary are
    # verified by the same workers when checked.
    with open_executor(ctx.params) as executor, ShardedVerifiers(ctx.params, executor) as verifiers:
        task_of = {task_id: Task.from_record(record) for task_id, record in tasks.items()}  # one per task, not per sample
        verifiers.prefetch((s["env"], task_of[s["task_id"]], s["completion"]) for s in samples)
        try:
            rows, feedbacks = score_batch(ctx.params, tasks, samples, verifiers, ctx.ws.human_labels,
                                          combiner_version=versions["combiner"])
        except (LabelsError, FeedbackSourceError) as error:
            raise StageError(str(error)) from None
        checked = check_known_hacks(hacks, verifiers, weights_of, version_of)
        # The benchmark canary: fixed completions under today's verifiers (a change is a verifier's).
        started = time.perf_counter()
        canary = check_canary(fixed, verifiers, weights_of, version_of)
        canary_seconds = time.perf_counter() - started  # its share of the stage (benchmarks/iteration.py)
        isolation = verifiers.isolation()
        rates = verifiers.verifications_per_s()

    write_jsonl(ctx.ws.rewards, rows)
    write_jsonl(ctx.ws.path(KNOWN_HACKS_CHECK), checked)
    write_jsonl(ctx.ws.canary_check, canary)
    named = {key: version for feedback in feedbacks for key, version in feedback.sources.items()}
    figures = _merge_figures([feedback.figures for feedback in feedbacks])
    # Per environment, over its shards' own seconds (the verifier sources saw verdicts already made).
    figures["verifications_per_s"] = {env: rates[env] for env in env_names if env in rates}
    return {
        "verifications": len(rows),
        **figures,
        "status": dict(sorted(Counter(f"{row['env']}/{row['status']}" for row in rows).items())),
        "reward_mean": _mean([row["reward"] for row in rows]),
        "per_env": {env: _env_figures([r for r in rows if r["env"] == env]) for env in env_names},
        "known_hacks": hack_figures(checked),
        "canary": canary_figures(canary, canary_seconds),
        # Strings: run_stage keeps them out of metrics/reward.json, in metrics/info/reward.json.
        "isolation": isolation,
        "feedback_sources": {**versions, **named},
    }


def _merge_figures(parts: list[dict]) -> dict:
    """The sources' figures as one tree: per-environment timings of the verifiers side by side."""
    merged: dict = {}
    for part in parts:
        merged = deep_merge(merged, part)
    return merged


def _env_figures(rows: list[dict]) -> dict:
    """Pass rate, mean reward and the mean of each reward component (over samples where it applied)."""
    values: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for name, value in row["components"].items():
            if value is not None:
                values[name].append(value)
    return {"pass_rate": _mean([float(r["passed"]) for r in rows]), "reward_mean": _mean([r["reward"] for r in rows]),
            "components": {name: _mean(v) for name, v in sorted(values.items())}}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
