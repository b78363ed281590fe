"""Mode grpo: group-relative policy optimisation on every sample of the batch, with the shaped reward
(training/grpo.py).

With ``train.grpo.rounds`` R > 1 it runs on-policy: the batch's tasks in R seeded parts
(training/rounds.py), each part after the first sampled from the policy as trained so far and scored by
the reward stage's sources (the run's ``sample_round``, closedloop.stages.onpolicy); those samples are
the run's ``rounds`` (the stage writes them to ``data/batch/train_rounds.jsonl``). One optimizer and one
schedule run over every round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from closedloop.envs.base import Task, load_tasks
from closedloop.io import read_jsonl
from closedloop.rewards.shaping import shaped_reward
from closedloop.training.grpo import Rollout, Transcript, train_grpo
from closedloop.training.grpo_stats import GrpoStats, combine_stats
from closedloop.training.modes.base import (TrainingError, TrainingMode, TrainingResult, TrainingRun,
                                           checkpoint_directory)
from closedloop.training.optimization import Carry, run_settings
from closedloop.training.rounds import RoundStore, figures_of, round_parts
from closedloop.workspace import Workspace

if TYPE_CHECKING:
    from closedloop.config import Params, TrainParams


class GrpoMode(TrainingMode):
    name = "grpo"
    mixed_precision = False  # grpo always trains in float32

    def check(self, params: Params) -> None:
        if params.sample.temperature == 0:
            raise TrainingError("train.mode is grpo but sample.temperature is 0: greedy samples of a task are "
                                "identical, so no group has a reward spread to learn from")

    def inputs(self, ws: Workspace, params: TrainParams) -> tuple[Path, ...]:
        return (ws.tasks, ws.samples, ws.rewards, ws.rollouts)

    def train(self, run: TrainingRun) -> TrainingResult:
        rounds = run.params.train.grpo.rounds
        done = train_rounds(run)
        stats = combine_stats(done.stats)
        return TrainingResult(_figures(stats, done, rounds), _untrained_reason(stats, done.totals),
                              steps_log=stats.steps_log, rounds=done.rows)


@dataclass
class Rounds:
    """What the rounds trained: each round's figures, the samples of the rounds after the first, the
    rollouts, infra errors and cut completions over all of them, and how many were resumed."""

    stats: list[GrpoStats] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=lambda: {"rollouts": 0, "infra": 0, "cut": 0})
    resumed: int = 0

    def add(self, stats: GrpoStats, rows: list[dict], counts: dict[str, Any]) -> None:
        self.stats.append(stats)
        self.rows += rows
        for key in self.totals:
            self.totals[key] += counts[key]


def train_rounds(run: TrainingRun) -> Rounds:
    """grpo over ``train.grpo.rounds`` generations: round 1 on the sample stage's samples, each later
    round on samples drawn from the policy as trained so far. A round an earlier run of this training
    finished (its policy saved under the checkpoint directory) is loaded, not trained again."""
    params = run.params.train
    rounds = params.grpo.rounds
    tasks = load_tasks(run.ws.tasks)
    task_of = {task.task_id: task for task in tasks}
    parts = round_parts([task.task_id for task in tasks], rounds, run.seed) if rounds > 1 else [list(task_of)]
    if rounds > 1 and params.lora.enabled:
        raise TrainingError("train.grpo.rounds > 1 with train.lora.enabled: the rounds' samplers load the policy "
                            "as trained so far, which needs merged weights; use train.grpo.rounds: 1 with LoRA")
    store = RoundStore(checkpoint_directory(run.ws),
                       None if run.checkpoint is None else {**run.checkpoint.identity, "rounds": rounds})
    done = Rounds()
    # One optimizer and schedule over every round, planned for every task's k samples (groups without
    # a reward spread drop out, so the schedule ends a little short of its end).
    carry = None if rounds == 1 else Carry(total_steps=sum(
        math.ceil(params.grpo.epochs * len(part) * run.params.sample.k / params.batch_size) for part in parts))
    for number, part in enumerate(parts, start=1):
        saved = (store.load(number, run.model, carry, params.grpo.lr, params.warmup_steps) if number < rounds
                 else None)
        if saved is not None:
            figures, rows = saved
            done.add(GrpoStats(**figures["stats"]), rows, figures)
            done.resumed = number
            continue
        batch, rows, counts = _round_batch(run, number, [task_of[task_id] for task_id in part], store)
        stats = train_grpo_batch(run, batch, seed=run.seed + number - 1, carry=carry,
                                 checkpoint=_round_checkpoint(run, rounds, number))
        done.add(stats, rows, counts)
        if number < rounds:
            store.save(number, run.model, run.tokenizer, run.params.sample, run.prompt_record,
                       {"stats": figures_of(stats), **counts}, rows, carry)
    if rounds > 1:
        store.clear()
    return done


def _round_checkpoint(run: TrainingRun, rounds: int, number: int) -> Any:
    """Round ``number``'s step checkpoints: the run's, or with rounds their own directory and identity."""
    checkpoint = run.checkpoint
    if rounds == 1 or checkpoint is None:
        return checkpoint
    return replace(checkpoint, directory=checkpoint_directory(run.ws) / f"round-{number}",
                   identity={**checkpoint.identity, "round": number})


def _round_batch(run: TrainingRun, number: int, tasks: list[Task],
                 store: RoundStore) -> tuple[list[Rollout], list[dict], dict[str, int]]:
    """Round ``number``'s rollouts, its samples (train_rounds.jsonl rows; none in round 1, which trains
    on the sample stage's) and its counts of rollouts, infra errors and cut completions."""
    if number == 1:
        batch, infra, cut = stage_rollouts(run, {task.task_id for task in tasks})
        rows = []
    else:
        rows = run.sample_round(store.policy_dir(number - 1), tasks, round_number=number,
                                seed=run.seed_of(f"train/round-{number}"))
        batch, infra, cut = round_rollouts(rows, {task.task_id: task.prompt for task in tasks}, run.params.train)
    return batch, rows, {"rollouts": len(batch), "infra": infra, "cut": cut}


def train_grpo_batch(run: TrainingRun, batch: list[Rollout], *, seed: int, checkpoint: Any,
                     carry: Carry | None = None) -> GrpoStats:
    """One grpo run over ``batch`` (Rollouts) with the stage's settings."""

    params = run.params.train
    grpo = params.grpo
    return train_grpo(
        run.model, run.tokenizer, batch, epochs=grpo.epochs, batch_size=params.batch_size, lr=grpo.lr,
        warmup_steps=params.warmup_steps, clip=grpo.clip, beta=grpo.beta, scale_advantages=grpo.scale_advantages,
        negative_weight=grpo.negative_weight, loss=grpo.loss, clip_high=grpo.epsilon_high,
        # dr_grpo's constant: an episode's loss runs over up to sample.rounds attempts
        max_completion_length=run.params.sample.max_new_tokens * run.params.sample.rounds, carry=carry,
        temperature=run.params.sample.temperature,
        **run_settings(params, seed=seed, progress=run.progress, encode_prompt=run.encode_prompt, checkpoint=checkpoint),
    )


def stage_rollouts(run: TrainingRun, task_ids: set[str]) -> tuple[list[Rollout], int, int]:
    """The sample stage's samples of ``task_ids`` as Rollouts with their shaped rewards; infra errors
    (neither the model's failure nor its success) left out and counted, and the completions cut at
    sample.max_new_tokens counted."""

    ws, params = run.ws, run.params.train
    prompts = {task.task_id: task.prompt for task in load_tasks(ws.tasks)}
    samples = read_jsonl(ws.samples, required=("sample_id", "task_id"))
    rewards = {r["sample_id"]: r for r in read_jsonl(ws.rewards, required=("sample_id", "reward", "steps", "status"))}
    # "logprobs" is null where the sampling backend returns none: the trainer computes them.
    rollouts = {r["sample_id"]: r for r in read_jsonl(ws.rollouts, required=("sample_id", "token_ids"))}
    batch, infra, cut = [], 0, 0
    for sample in samples:
        sample_id = sample["sample_id"]
        if sample_id not in rewards or sample_id not in rollouts:
            raise TrainingError(f"{ws.rewards} / {ws.rollouts}: no reward or rollout for sample {sample_id}")
        if sample["task_id"] not in task_ids:
            continue
        reward = rewards[sample_id]
        if reward["status"] == "infra_error":
            infra += 1
            continue
        rollout = rollouts[sample_id]
        cut += sample.get("finish_reason") == "length"  # stopped by sample.max_new_tokens, not by the model
        # An episode's final attempt was sampled on its transcript: its log-probabilities are under that.
        # With several rounds the rollout holds the transcript's tokens: the whole episode trains.
        prompt = sample["episode"]["prompt"] if "episode" in sample else prompts[sample["task_id"]]
        batch.append(Rollout(group=sample["task_id"], prompt=prompt,
                             token_ids=tuple(rollout["token_ids"]),
                             logprobs=None if rollout.get("logprobs") is None else tuple(rollout["logprobs"]),
                             reward=shaped_reward(reward["reward"], reward["steps"], params.shaping,
                                                  reward.get("passed")),
                             transcript=_transcript(rollout.get("episode"))))
    return batch, infra, cut


def _transcript(record: dict | None) -> Transcript | None:
    """rollouts.jsonl's ``episode`` (stages/sample.py) as a Transcript; None for a one-round sample."""
    if not record:
        return None
    return Transcript(prompt_ids=tuple(record["prompt_ids"]), spans=tuple(tuple(span) for span in record["model_spans"]),
                      span_logprobs=tuple(None if lp is None else tuple(lp) for lp in record["span_logprobs"]))


def round_rollouts(rows: list[dict], prompts: dict[str, str], params: TrainParams) -> tuple[list[Rollout], int, int]:
    """An on-policy round's scored samples (onpolicy.sample_and_score rows) as Rollouts, as above."""

    batch, infra, cut = [], 0, 0
    for row in rows:
        scored = row["scored"]
        if scored["status"] == "infra_error":
            infra += 1
            continue
        cut += row["finish_reason"] == "length"
        batch.append(Rollout(group=row["task_id"], prompt=prompts[row["task_id"]], token_ids=tuple(row["token_ids"]),
                             logprobs=None if row["logprobs"] is None else tuple(row["logprobs"]),
                             reward=shaped_reward(scored["reward"], scored["steps"], params.shaping,
                                                  scored["passed"])))
    return batch, infra, cut


def _untrained_reason(stats: GrpoStats, totals: dict[str, int]) -> str:
    if not totals["rollouts"]:
        return (f"no rollouts to train on ({totals['infra']} infra errors left out)" if totals["infra"]
                else "no rollouts to train on")
    if stats.skipped_groups == stats.groups:
        return f"no group had a reward spread ({stats.skipped_groups} groups skipped)"
    return (f"no rollout left to train on ({stats.skipped_groups} of {stats.groups} groups had no reward "
            "spread; the others only empty completions)")


def _figures(stats: GrpoStats, done: Rounds, rounds: int) -> dict[str, Any]:
    """The stage's metrics of a grpo run (the per-step records go into the candidate's record)."""
    totals, batch_size = done.totals, done.totals["rollouts"]
    return {"examples": {"rollout": stats.rollouts}, "groups": stats.groups, "skipped_groups": stats.skipped_groups,
            "infra_errors_left_out": totals["infra"], "steps": stats.steps, "tokens": stats.tokens,
            "tokens_per_s": round(stats.tokens_per_s, 1), "first_loss": stats.first_loss,
            "final_loss": stats.final_loss, "clip_fraction": round(stats.clip_fraction, 4),
            "initial_log_ratio": stats.initial_log_ratio, "behaviour_logprobs": stats.behaviour_logprobs,
            "logprob_delta_mean": stats.logprob_delta_mean, "logprob_delta_max": stats.logprob_delta_max,
            # What TRL and verl log for GRPO (training/grpo.py).
            "frac_reward_zero_std": round(stats.zero_std_share, 6), "advantage_mean": round(stats.advantage_mean, 6),
            "advantage_std": round(stats.advantage_std, 6),
            "completion_length_mean": round(stats.completion_length_mean, 2),
            # Episodes: the earlier attempts' tokens trained with the final ones; the feedback between them
            # was context only.
            **({"episode_tokens": {"earlier_attempts": stats.earlier_attempt_tokens, "feedback": stats.feedback_tokens}}
               if stats.earlier_attempt_tokens or stats.feedback_tokens else {}),
            "truncated_share": round(totals["cut"] / batch_size, 6) if batch_size else None,
            # On-policy rounds: how many, and each round's samples' pass rate (the policy's, as it trained).
            "rounds": rounds, "rounds_resumed": done.resumed,
            **({"round_pass_rates": _round_pass_rates(done.rows)} if rounds > 1 else {}),
            **stats.run_figures()}


def _round_pass_rates(rows: list[dict]) -> dict[str, float]:
    """Each on-policy round's share of passing samples: the policy's own pass rate as it trained."""
    by_round: dict[int, list[bool]] = {}
    for row in rows:
        by_round.setdefault(row["round"], []).append(bool(row["scored"]["passed"]))
    return {f"round_{number}": round(sum(v) / len(v), 6) for number, v in sorted(by_round.items())}
