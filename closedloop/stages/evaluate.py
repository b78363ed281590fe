"""Stage evaluate: champion and candidate on the fixed benchmark, same settings and seed."""

from __future__ import annotations

from closedloop.evaluation.runner import evaluate_policy
from closedloop.io import write_json
from closedloop.sampling.base import SamplingError
from closedloop.execution.factory import open_executor
from closedloop.rewards.verification import ShardedVerifiers
from closedloop.envs.base import load_tasks
from closedloop.stages.common import StageContext, StageError
from closedloop.stages.prompting import check_sampling_settings


def run(ctx: StageContext) -> dict:
    params = ctx.params
    tasks = load_tasks(ctx.ws.benchmark_tasks)
    seed = ctx.seed("evaluate")
    results = {}
    for model_dir in (ctx.ws.champion, ctx.ws.candidate):
        check_sampling_settings(model_dir, params)
    # Sampling and verification in shards on the executor (execution.backend), as in sample and reward.
    with open_executor(params) as executor, ShardedVerifiers(params, executor) as verifiers:
        for role, model_dir in (("champion", ctx.ws.champion), ("candidate", ctx.ws.candidate)):
            try:
                results[role] = evaluate_policy(
                    model_dir, tasks, params=params, samples_per_task=params.evaluate.samples_per_task,
                    seed=seed, batch_size=params.evaluate.batch_size, verifiers=verifiers, progress=ctx.progress,
                    executor=executor,
                )
            except SamplingError as error:
                raise StageError(f"evaluate {role} ({params.sample.backend.name} backend): {error}") from None
            # The verifier workers go before the next policy's samplers start: on a small cluster (a
            # 2-CPU local Ray) both pools at once do not fit, and the samplers would wait forever.
            verifiers.close()
    write_json(ctx.ws.evaluation, results)
    metrics = {}
    for role, result in results.items():
        summary = result["summary"]
        metrics[f"{role}_pass@1"] = summary["overall"]["pass@1"]
        for group in ("envs", "slices"):
            for name, figures in summary[group].items():
                metrics[f"{role}_pass@1/{name}"] = figures["pass@1"]
    return metrics
