"""Stage reward: every sample verified by its environment (in the sandbox where it runs code);
components kept apart, combined by the environment's weights, each sample naming its feedback sources."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from closedloop.envs import reward_weights
from closedloop.io import read_jsonl, write_jsonl
from closedloop.rewards.combine import combine
from closedloop.rewards.sources import component_versions, feedback_sources
from closedloop.stages.common import EnvPools, StageContext, StageError, load_tasks


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
    verdicts, weights, versions, seconds = {}, {}, {}, {}
    with EnvPools(ctx.params) as verifiers:
        for env_name, env_samples in sorted(by_env.items()):
            env = verifiers.env(env_name)
            weights[env_name] = reward_weights(env, ctx.params)
            versions[env_name] = component_versions(env, ctx.params)
            started = time.perf_counter()
            results = verifiers.verify_batch(env_name, [tasks[s["task_id"]] for s in env_samples],
                                             [s["completion"] for s in env_samples])
            seconds[env_name] = time.perf_counter() - started
            verdicts.update({s["sample_id"]: v for s, v in zip(env_samples, results)})
        isolation = verifiers.isolation()

    rows = []
    for sample in samples:
        env_name, verdict = sample["env"], verdicts[sample["sample_id"]]
        # The sources of this sample's reward: the verifier, each component that applied, the combiner.
        applied = {f"component:{env_name}/{name}": versions[env_name][name]
                   for name, value in verdict.components.items() if value is not None}
        rows.append({
            "sample_id": sample["sample_id"], "task_id": sample["task_id"], "env": env_name,
            "status": verdict.status, "passed": verdict.passed, "feedback": verdict.feedback,
            "failed_step": verdict.failed_step, "components": verdict.components, "steps": verdict.steps,
            "reward": round(combine(verdict.components, weights[env_name]), 6),
            "feedback_sources": {f"verifier:{env_name}": sources[f"verifier:{env_name}"], **applied,
                                 "combiner": sources["combiner"]},
        })
    write_jsonl(ctx.ws.rewards, rows)
    return {
        "verifications": len(rows),
        "verifications_per_s": {env: round(len(by_env[env]) / s, 1) if s else 0.0 for env, s in seconds.items()},
        "status": dict(sorted(Counter(f"{row['env']}/{row['status']}" for row in rows).items())),
        "reward_mean": _mean([row["reward"] for row in rows]),
        "per_env": {env: _env_figures([r for r in rows if r["env"] == env]) for env in sorted(by_env)},
        "isolation": isolation,
        "feedback_sources": sources,
    }


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
