"""Stage evaluate: champion and candidate on the fixed benchmark, same settings and seed.

Then, with ``gate.confirm_samples``, the environments and slices the gate would hold the candidate
for are measured again, both models, on their tasks only, with that many samples per task and a seed
of their own: the gate decides those groups on the second measurement (evaluation.gate.decide).
"""

from __future__ import annotations

from closedloop.envs.base import load_tasks
from closedloop.evaluation.gate import groups, regressed_groups
from closedloop.evaluation.runner import evaluate_policy
from closedloop.execution.factory import open_executor
from closedloop.io import write_json
from closedloop.rewards.verification import ShardedVerifiers
from closedloop.sampling.base import SamplingError
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
        def evaluate_both(task_list, samples_per_task, seed):
            evaluations = {}
            for role, model_dir in (("champion", ctx.ws.champion), ("candidate", ctx.ws.candidate)):
                try:
                    evaluations[role] = evaluate_policy(
                        model_dir, task_list, params=params, samples_per_task=samples_per_task, seed=seed,
                        batch_size=params.evaluate.batch_size, verifiers=verifiers, progress=ctx.progress,
                        executor=executor,
                    )
                except SamplingError as error:
                    raise StageError(f"evaluate {role} ({params.sample.backend.name} backend): {error}") from None
                # The verifier workers go before the next policy's samplers start: on a small cluster (a
                # 2-CPU local Ray) both pools at once do not fit, and the samplers would wait forever.
                verifiers.close()
            return evaluations

        results = evaluate_both(tasks, params.evaluate.samples_per_task, seed)
        confirmation = None
        if params.gate.confirm_samples:
            regressed = regressed_groups(results["champion"]["summary"], results["candidate"]["summary"],
                                         slice_tolerance=params.gate.slice_tolerance, noise_z=params.gate.noise_z)
            confirmation = _confirm(regressed, tasks, params.gate.confirm_samples, ctx.seed("evaluate/confirm"),
                                    evaluate_both)
    write_json(ctx.ws.evaluation, {**results, **({"confirmation": confirmation} if confirmation else {})})
    metrics = {}
    for role, result in results.items():
        summary = result["summary"]
        metrics[f"{role}_pass@1"] = summary["overall"]["pass@1"]
        for group in ("envs", "slices"):
            for name, figures in summary[group].items():
                metrics[f"{role}_pass@1/{name}"] = figures["pass@1"]
        if "rounds" in result:  # episodes: pass@1 after each round, and how often later rounds fixed the first
            # (MLflow: stage/evaluate/rounds.<role>.pass_at_1.<round>, one chart per round across iterations)
            metrics.setdefault("rounds", {})[role] = {
                "pass@1": {str(number): by_round["overall"]["pass@1"]
                           for number, by_round in enumerate(result["rounds"]["by_round"], start=1)},
                "correction_rate": result["rounds"]["correction_rate"]["rate"]}
    metrics["confirmed_groups"] = len(confirmation["groups"]) if confirmation else 0
    return metrics


def _confirm(regressed: list[str], tasks: list, samples_per_task: int, seed: int, evaluate_both) -> dict | None:
    """The regressed groups ("env rules", "slice rules/edge") measured again on their tasks: {"samples_per_task",
    "seed", "groups": {name: {"champion": figures, "candidate": figures}}}, figures as stats.summarize
    gives them; None when nothing regressed."""
    if not regressed:
        return None
    envs = {name.split(" ", 1)[1] for name in regressed if name.startswith("env ")}
    slices = {name.split(" ", 1)[1] for name in regressed if name.startswith("slice ")}
    chosen = [task for task in tasks if task.env in envs or f"{task.env}/{task.slice}" in slices]
    again = evaluate_both(chosen, samples_per_task, seed)
    figures = {role: groups(result["summary"]) for role, result in again.items()}
    return {"samples_per_task": samples_per_task, "seed": seed, "tasks": len(chosen),
            "groups": {name: {role: figures[role][name] for role in ("champion", "candidate")} for name in regressed}}
