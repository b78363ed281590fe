"""Stage reward: every sample scored by its feedback sources (its environment's verifier, in the
sandbox where it runs code; the human review labels; the user's sources in params.yaml), components
kept apart, combined by the environment's weights, each row naming the sources and versions that
produced it. Then every known reward hack is re-verified with today's verifiers, for the gate."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from itertools import pairwise

from closedloop.envs import reward_weights
from closedloop.envs.base import Task, load_tasks
from closedloop.envs.episodes import episode_checks
from closedloop.execution.factory import open_executor
from closedloop.io import read_jsonl, write_jsonl
from closedloop.nested import deep_merge
from closedloop.rewards.canary import (
    benchmark_records,
    canary_figures,
    canary_set,
    check_canary,
)
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
    episodes = any("episode" in sample for sample in samples)
    with open_executor(ctx.params) as executor, ShardedVerifiers(ctx.params, executor) as verifiers:
        task_of = {task_id: Task.from_record(record) for task_id, record in tasks.items()}  # one per task, not per sample
        if episodes:
            # An episode's reward is its final attempt on the checks the model never saw feedback from.
            task_of = {task_id: episode_checks(verifiers.env(task.env), task).hidden for task_id, task in task_of.items()}
            tasks = {task_id: task.to_record() for task_id, task in task_of.items()}
        verifiers.prefetch((s["env"], task_of[s["task_id"]], attempt) for s in samples
                           for attempt in s.get("episode", {}).get("attempts", [s["completion"]]))
        try:
            rows, feedbacks = score_batch(ctx.params, tasks, samples, verifiers, ctx.ws.human_labels,
                                          combiner_version=versions["combiner"])
        except (LabelsError, FeedbackSourceError) as error:
            raise StageError(str(error)) from None
        if episodes:
            rows = [with_episode(row, episode_row(sample, task_of[sample["task_id"]], verifiers),
                                 ctx.params.reward.round_cost) for row, sample in zip(rows, samples)]
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
        **({"episodes": episode_figures(rows)} if episodes else {}),
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


def with_episode(row: dict, episode: dict, round_cost: float) -> dict:
    """The reward row of an episode: its per-round signals, and with ``reward.round_cost`` the reward
    less that cost per round after the first (the combined reward before it kept as reward_before_rounds)."""
    if not round_cost or episode["rounds"] == 1:
        return {**row, "episode": episode}
    reward = round(max(0.0, row["reward"] - round_cost * (episode["rounds"] - 1)), 6)
    return {**row, "reward": reward, "episode": {**episode, "reward_before_rounds": row["reward"]}}


def episode_row(sample: dict, hidden: Task, verifiers) -> dict:
    """The per-round step signals of one episode: each attempt on the hidden checks, beside what the
    visible checks said of it."""
    episode = sample["episode"]
    verdicts = verifiers.verify_batch(sample["env"], [hidden] * len(episode["attempts"]), episode["attempts"])
    hidden_passed = [bool(v.passed) for v in verdicts]
    return {"rounds": episode["rounds"], "stop": episode["stop"], "hidden_passed": hidden_passed,
            "visible_passed": episode["visible_passed"], "first_passed": hidden_passed[0],
            # A later round that fails the hidden checks an earlier one passed: what feedback-chasing looks like.
            "hidden_lost": any(a and not b for a, b in pairwise(hidden_passed)),
            # A later attempt that quotes the feedback it was shown, rather than acting on it.
            "echoed": sum(_quotes(attempt, shown) for attempt, shown in zip(episode["attempts"][1:], episode["feedback"]))}


def _quotes(attempt: str, feedback: str) -> bool:
    shown = " ".join(feedback.split())
    return len(shown) >= 12 and shown in " ".join(attempt.split())


def episode_figures(rows: list[dict]) -> dict:
    """First attempt against final attempt on the hidden checks, and how often later rounds fixed or broke."""
    episodes = [row["episode"] for row in rows]
    n = max(1, len(episodes))
    first_failed = [e for e in episodes if not e["first_passed"]]
    return {"first_pass_rate": round(sum(e["first_passed"] for e in episodes) / n, 4),
            "final_pass_rate": round(sum(e["hidden_passed"][-1] for e in episodes) / n, 4),
            "corrected": round(sum(e["hidden_passed"][-1] for e in first_failed) / max(1, len(first_failed)), 4),
            "hidden_lost": round(sum(e["hidden_lost"] for e in episodes) / n, 4),
            "echoed_attempts": sum(e["echoed"] for e in episodes),
            "rounds_mean": round(sum(e["rounds"] for e in episodes) / n, 4)}


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
