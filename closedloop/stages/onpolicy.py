"""On-policy rounds of the train stage (``train.grpo.rounds``): sample from the policy as trained so
far, score the samples with the reward stage's feedback sources, train on them, repeat.

The sample stage draws the batch from the champion, so an offline GRPO that trains a whole epoch on it
is off-policy after its first steps: the policy ratio leaves the clip range and the clipped tokens give
no gradient (measured: KL to the sampling policy 0.74 by the last step). With R rounds the batch's
tasks are cut into R seeded parts. Round 1 trains on the sample stage's samples of the first part (the
champion is the policy then); round r samples part r from the policy after round r - 1, through the
same seams as the sample and reward stages (closedloop.sampling.shards on the executor, the sandbox
pools of ShardedVerifiers, score_batch), so Ray and every sampler backend serve it too.

The rounds' samples and rewards are the train stage's output (``data/batch/train_rounds.jsonl``, one
row per sample, seeded: ``dvc repro`` writes the same bytes), so the lineage of a model version names
every sample it learned from. Between rounds the policy is saved under the checkpoint directory: it
is what the next round's samplers load, and with checkpointing on, a killed train stage resumes after
the last finished round (and within a round from its step checkpoint): closedloop.training.rounds.
This module is the sampling and scoring; closedloop.training.modes.grpo trains the rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from closedloop.envs.base import Task
from closedloop.execution import ray_backend
from closedloop.execution.factory import open_executor
from closedloop.rewards.feedback import FeedbackSourceError
from closedloop.rewards.human import LabelsError
from closedloop.rewards.scoring import score_batch
from closedloop.rewards.verification import ShardedVerifiers
from closedloop.sampling.base import SamplingError
from closedloop.sampling.shards import sample_sharded
from closedloop.stages.common import StageContext, StageError


def sample_and_score(ctx: StageContext, policy_dir: Path, tasks: list[Task], *, round_number: int,
                     seed: int) -> list[dict]:
    """k samples per task from the policy saved in ``policy_dir``, each scored as the reward stage
    scores the batch: one row per sample with its tokens, log-probabilities and, under "scored", its
    rewards.jsonl row (the train_rounds.jsonl rows)."""

    settings = ctx.params.sample
    with open_executor(executor_params(ctx.params)) as executor:
        try:
            sampled = sample_sharded(executor, ctx.params, policy_dir, [task.prompt for task in tasks],
                                     [task.task_id for task in tasks], k=settings.k, seed=seed,
                                     batch_size=settings.batch_size, progress=ctx.progress)
        except SamplingError as error:
            raise StageError(f"train round {round_number}: sample ({settings.backend.name} backend): {error}") from None
        samples, rollouts = [], []
        for task, task_samples in zip(tasks, sampled.generations):
            for index, sample in enumerate(task_samples):
                samples.append({"sample_id": f"{task.task_id}#r{round_number}.{index}", "task_id": task.task_id,
                                "env": task.env, "slice": task.slice, "kind": task.kind, "round": round_number,
                                "completion": sample.text, "finish_reason": sample.finish_reason})
                rollouts.append({"token_ids": list(sample.token_ids),
                                 "logprobs": None if sample.logprobs is None else [round(lp, 6) for lp in sample.logprobs]})
        with ShardedVerifiers(executor_params(ctx.params), executor) as verifiers:
            verifiers.prefetch((s["env"], task, s["completion"])
                               for task, s in zip((t for t in tasks for _ in range(settings.k)), samples))
            try:
                rewards, _ = score_batch(ctx.params, {task.task_id: task.to_record() for task in tasks}, samples,
                                         verifiers, ctx.ws.human_labels)
            except (LabelsError, FeedbackSourceError) as error:
                raise StageError(f"train round {round_number}: {error}") from None
    # "scored": the reward stage's row for the sample, whole (components, sources and versions), so
    # `closedloop rescore` puts today's verifiers beside it as it does for rewards.jsonl.
    return [{**sample, **rollout, "scored": reward} for sample, rollout, reward in zip(samples, rollouts, rewards)]


def executor_params(params: Any) -> Any:
    """Where the rounds sample and score: on ``execution.backend``, except inside a Ray task (the train
    stage on a Ray worker), where they use local processes on that worker. The train task holds its CPUs
    while the rounds run, and the samplers and sandbox actors they would ask for on top of it may never
    fit a small cluster: waiting for them would hang the stage."""
    if params.execution.backend != "ray" or not ray_backend.in_ray_task():
        return params
    return params.model_copy(update={"execution": params.execution.model_copy(update={"backend": "local"})})
