"""Stage evaluate: champion and candidate on the fixed benchmark, same settings and seed."""

from __future__ import annotations

from closedloop.envs import get_env
from closedloop.evaluation.runner import evaluate_policy
from closedloop.io import write_json
from closedloop.stages.common import StageContext, check_sampling_settings, load_tasks, sandbox_pool


def run(ctx: StageContext) -> dict:
    params = ctx.params
    tasks = load_tasks(ctx.ws.benchmark_tasks)
    seed = ctx.seed("evaluate")
    results = {}
    for model_dir in (ctx.ws.champion, ctx.ws.candidate):
        check_sampling_settings(model_dir, params)
    with sandbox_pool(params) as pool:
        for role, model_dir in (("champion", ctx.ws.champion), ("candidate", ctx.ws.candidate)):
            results[role] = evaluate_policy(
                model_dir, tasks, settings=params.sample, samples_per_task=params.evaluate.samples_per_task,
                seed=seed, batch_size=params.evaluate.batch_size, env_for=lambda name: get_env(name, params),
                pool=pool, progress=ctx.progress,
            )
    write_json(ctx.ws.evaluation, results)
    metrics = {}
    for role, result in results.items():
        summary = result["summary"]
        metrics[f"{role}_pass@1"] = summary["overall"]["pass@1"]
        for name, figures in summary["slices"].items():
            metrics[f"{role}_pass@1/{name}"] = figures["pass@1"]
    return metrics
