"""Stage reward: every sample verified in the sandbox; components kept apart, then combined."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from closedloop.envs import get_env
from closedloop.io import read_jsonl, write_jsonl
from closedloop.rewards.combine import combine
from closedloop.rewards.sources import feedback_sources
from closedloop.stages.common import StageContext, StageError, load_tasks, sandbox_pool


def run(ctx: StageContext) -> dict:
    tasks = {task.task_id: task for task in load_tasks(ctx.ws.tasks)}
    samples = read_jsonl(ctx.ws.samples, required=("sample_id", "task_id", "env", "completion"))
    unknown = sorted({s["task_id"] for s in samples} - set(tasks))
    if unknown:
        raise StageError(f"{ctx.ws.samples}: samples for tasks not in {ctx.ws.tasks}: {unknown[:3]}")
    sources = feedback_sources(ctx.params)
    by_env: dict[str, list[dict]] = defaultdict(list)
    for sample in samples:
        by_env[sample["env"]].append(sample)
    verdicts = {}
    started = time.perf_counter()
    with sandbox_pool(ctx.params) as pool:
        for env_name, env_samples in sorted(by_env.items()):
            env = get_env(env_name, ctx.params)
            results = env.verify_batch([tasks[s["task_id"]] for s in env_samples],
                                       [s["completion"] for s in env_samples], pool)
            verdicts.update({s["sample_id"]: v for s, v in zip(env_samples, results)})
    verify_s = time.perf_counter() - started

    weights = ctx.params.reward.weights
    rows = []
    for sample in samples:
        verdict = verdicts[sample["sample_id"]]
        rows.append({
            "sample_id": sample["sample_id"], "task_id": sample["task_id"], "env": sample["env"],
            "status": verdict.status, "passed": verdict.passed, "feedback": verdict.feedback,
            "components": verdict.components, "steps": verdict.steps,
            "reward": round(combine(verdict.components, weights), 6),
            "feedback_sources": [f"verifier:{sample['env']}", "combiner"],
        })
    write_jsonl(ctx.ws.rewards, rows)
    rewards = [row["reward"] for row in rows]
    return {
        "verifications": len(rows),
        "verifications_per_s": round(len(rows) / verify_s, 1) if verify_s else 0.0,
        "status": dict(sorted(Counter(row["status"] for row in rows).items())),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "feedback_sources": sources,
    }
