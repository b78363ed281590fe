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
the last finished round (and within a round from its step checkpoint).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from closedloop.envs.base import Task
from closedloop.execution import ray_backend
from closedloop.execution.factory import open_executor
from closedloop.faults import fault_point
from closedloop.io import read_jsonl, write_jsonl
from closedloop.models.loading import save_policy
from closedloop.models.settings import save_settings
from closedloop.rewards.feedback import FeedbackSourceError
from closedloop.rewards.human import LabelsError
from closedloop.rewards.scoring import score_batch
from closedloop.rewards.verification import ShardedVerifiers
from closedloop.sampling.base import SamplingError
from closedloop.sampling.shards import sample_sharded
from closedloop.stages.common import StageContext, StageError

ROUND_FILE = "round.json"
STATE_FILE = "policy_state.pt"


def round_parts(task_ids: list[str], rounds: int, seed: int) -> list[list[str]]:
    """The batch's tasks cut into ``rounds`` parts of near-equal size, after a seeded shuffle (the tasks
    file is ordered by environment: every part must hold every environment's share)."""
    order = list(task_ids)
    random.Random(seed).shuffle(order)
    return [order[len(order) * r // rounds: len(order) * (r + 1) // rounds] for r in range(rounds)]


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


class RoundStore:
    """The policy after each finished round, under ``directory`` (the train stage's checkpoint
    directory): a model directory the next round's samplers load, its exact weights, the round's
    training figures and the samples it trained on. ``identity`` (the step checkpoints' identity)
    decides whether a saved round belongs to this training run; None: nothing is resumed."""

    def __init__(self, directory: Path, identity: dict | None) -> None:
        self.directory = Path(directory)
        self.identity = identity

    def policy_dir(self, number: int) -> Path:
        return self.directory / "rounds" / f"round-{number}"

    def save(self, number: int, model: Any, tokenizer: Any, settings: Any, prompt_record: dict, figures: dict,
             rows: list[dict], carry: Any = None) -> Path:
        """Save round ``number``'s policy and record; written to a staging directory and renamed, so a
        kill leaves either the whole round or none of it."""
        import torch

        target = self.policy_dir(number)
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        save_policy(model, tokenizer, staging)
        save_settings(staging, settings, prompt_record)
        torch.save({"model": model.state_dict(), "carry": None if carry is None else carry.state()},
                   staging / STATE_FILE)
        write_jsonl(staging / "samples.jsonl", rows)
        (staging / ROUND_FILE).write_text(json.dumps({"identity": self.identity, "figures": figures}, default=str))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        fault_point("train:round")  # tests kill the stage here, between two rounds
        return target

    def load(self, number: int, model: Any, carry: Any = None, lr: float = 0.0,
             warmup_steps: int = 0) -> tuple[dict, list[dict]] | None:
        """Round ``number`` as an earlier run of this training left it: its figures and samples, with
        its weights loaded into ``model`` and its optimizer and schedule into ``carry`` (made for
        ``lr`` and ``warmup_steps``); None when it is not saved or belongs to another run."""
        import torch

        path = self.policy_dir(number)
        if self.identity is None or not (path / ROUND_FILE).is_file():
            return None
        record = json.loads((path / ROUND_FILE).read_text())
        if record.get("identity") != json.loads(json.dumps(self.identity, default=str)):
            return None
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        if carry is not None:
            carry.restore(model, lr, warmup_steps, state["carry"])
        return record["figures"], read_jsonl(path / "samples.jsonl")

    def clear(self) -> None:
        shutil.rmtree(self.directory / "rounds", ignore_errors=True)


def figures_of(stats: Any) -> dict:
    """A round's GrpoStats as plain values (what RoundStore saves)."""
    return asdict(stats)
