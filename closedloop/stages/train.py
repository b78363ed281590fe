"""Stage train: the candidate, trained from the champion in the mode params.yaml names.

- ``sft``: the warm-start references only (a control: what training without the loop's data gives);
- ``rft``: rejection-sampling fine-tuning on the batch's positives and failure→fix pairs, the
  references, and the positives of earlier batches replayed through DVC;
- ``grpo``: group-relative policy optimisation on every sample of the batch, with the shaped reward.
  With ``train.grpo.rounds`` R > 1 it runs on-policy: the batch's tasks in R parts, each part after the
  first sampled from the policy as trained so far and scored by the reward stage's sources
  (closedloop.stages.onpolicy); those samples are the stage's output ``data/batch/train_rounds.jsonl``.

The mode, its settings and the data mix are written into the model directory
(``closedloop_training.json``) and into the stage metrics, from which lineage tags the model version.

A run that trained 0 steps (an empty training set, ``train.steps: 0``, a grpo batch in which no group
had a reward spread) still writes the candidate (the champion's weights: later stages need the
directory), but says so: ``"trained": false`` and ``"untrained_reason"`` in both. The gate then holds
it, and the version step registers no model version for it.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import dataclass
from functools import partial

from closedloop.config import parse_params
from closedloop.envs.base import load_tasks
from closedloop.execution.factory import open_executor, train_resources
from closedloop.io import read_json, read_jsonl, write_jsonl
from closedloop.lineage.dvc import DvcError, DvcWorkspace
from closedloop.models.loading import load_policy, model_fingerprint, save_policy
from closedloop.models.settings import save_settings
from closedloop.rewards.shaping import shaped_reward
from closedloop.stages.common import StageContext, StageError
from closedloop.stages.onpolicy import RoundStore, figures_of, round_parts, sample_and_score
from closedloop.stages.prompting import prompt_format_of
from closedloop.training.candidate_record import TRAINING_FILE
from closedloop.training.causal_lm import Carry, Checkpointing, Example, ResumeRefused, train_causal_lm, use_bf16
from closedloop.training.grpo import GrpoStats, Rollout, combine_stats, train_grpo
from closedloop.training.lora import merged, with_lora
from closedloop.workspace import TRAIN_SET, Workspace

TRAIN_FUNCTION = "closedloop.stages.train:train_on_worker"


def run(ctx: StageContext) -> dict:
    """Train where ``execution`` says: in this process (local), or as a Ray task on a worker with
    ``execution.ray.train_num_cpus`` / ``train_num_gpus``, apart from the sampling and reward workers.
    The task reads and writes the workspace by its absolute path (on a cluster: a shared filesystem)."""

    payload = {"workspace": str(ctx.ws.root.resolve()), "params": ctx.params.model_dump(mode="json"),
               "progress": ctx.progress}
    resources = train_resources(ctx.params)
    with open_executor(ctx.params) as executor:
        figures = executor.call(TRAIN_FUNCTION, payload, resources)
        where = executor.describe_call(resources)
    return {**figures, "execution": where}  # a string: metrics/info/train.json


def train_on_worker(payload: dict) -> dict:
    """The train stage's work, from plain records (what crosses to a Ray worker)."""

    return train(StageContext(ws=Workspace.at(payload["workspace"]), params=parse_params(payload["params"]),
                              progress=payload["progress"]))


def train(ctx: StageContext) -> dict:
    report = read_json(ctx.ws.validation_report)
    if not report.get("success"):
        raise StageError(f"{ctx.ws.validation_report}: the batch failed validation; refusing to train on it")
    params = ctx.params.train
    mode = params.mode
    if mode == "grpo" and ctx.params.sample.temperature == 0:
        raise StageError("train.mode is grpo but sample.temperature is 0: greedy samples of a task are "
                         "identical, so no group has a reward spread to learn from")
    inputs = {"grpo": (ctx.ws.tasks, ctx.ws.samples, ctx.ws.rewards, ctx.ws.rollouts),
              "rft": (ctx.ws.train_set, ctx.ws.references), "sft": (ctx.ws.references,)}[mode]
    if mode == "rft" and not params.include_references:
        inputs = (ctx.ws.train_set,)

    model, tokenizer = load_policy(ctx.ws.champion, device=ctx.params.model.device, dtype=ctx.params.model.dtype)
    # Prompts are tokenised exactly as the sampler fed them (a chat template, or raw text).
    prompt_format = prompt_format_of(ctx.params, tokenizer)
    encode_prompt = partial(prompt_format.encode, tokenizer)
    seed = ctx.seed("train")
    if params.lora.enabled:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the adapters' initialisation
            try:
                model = with_lora(model, params.lora)
            except ValueError as error:
                raise StageError(str(error)) from None
    checkpoint = None
    if params.checkpoint_every:
        # What this training run is: a checkpoint of any other run is refused, naming what changed.
        identity = {**{f"input {path.name}": _file_hash(path) for path in inputs},
                    "champion": model_fingerprint(ctx.ws.champion), "seed": seed,
                    "model dtype": str(next(model.parameters()).dtype),
                    # auto resolves per machine: a checkpoint trained in bf16 is not resumed in float32
                    "mixed precision": mode != "grpo" and use_bf16(params.mixed_precision, model),
                    **{f"params train.{key}": value for key, value in params.model_dump(mode="json").items()
                       if key != "checkpoint_every"}}
        checkpoint = Checkpointing(ctx.ws.candidate.with_name("candidate.checkpoint"), params.checkpoint_every, identity)
    try:
        if mode == "grpo":
            figures = _train_grpo(ctx, model, tokenizer, seed, checkpoint, encode_prompt)
        else:
            figures = _train_supervised(ctx, model, tokenizer, seed, checkpoint, encode_prompt)
            write_jsonl(ctx.ws.train_rounds, [])  # on-policy rounds are grpo's
    except ResumeRefused as error:
        raise StageError(str(error)) from None

    if params.lora.enabled:

        model = merged(model)
    reason = figures.pop("untrained_reason")  # used only when nothing was trained
    steps_log = figures.pop("steps_log", None)  # grpo's per-step figures: the model's record, not metrics
    trained = {"trained": figures["steps"] > 0, "untrained_reason": None if figures["steps"] > 0 else reason}
    record = {"mode": mode, "parent_version": model_fingerprint(ctx.ws.champion), "iteration": ctx.params.loop.iteration,
              "params": params.model_dump(mode="json"), "data": figures["examples"], **trained,
              **({"steps_log": steps_log} if steps_log is not None else {})}
    staging = ctx.ws.candidate.with_name("candidate.staging")
    shutil.rmtree(staging, ignore_errors=True)
    save_policy(model, tokenizer, staging)
    # the rollouts it learned from were sampled with these settings and this prompt format
    save_settings(staging, ctx.params.sample, prompt_format.record(tokenizer))
    (staging / TRAINING_FILE).write_text(json.dumps(record, sort_keys=True, indent=2) + "\n")
    shutil.rmtree(ctx.ws.candidate, ignore_errors=True)
    staging.rename(ctx.ws.candidate)
    return {"mode": mode, **figures, **trained, "parent_version": record["parent_version"],
            "model_version": model_fingerprint(ctx.ws.candidate)}


def _train_supervised(ctx: StageContext, model, tokenizer, seed: int, checkpoint, encode_prompt) -> dict:
    params = ctx.params.train
    records: list[dict] = []
    replay: dict[str, int] = {}
    if params.mode == "rft":
        records = read_jsonl(ctx.ws.train_set, required=("source", "prompt", "completion"))
        replayed, replay = replay_positives(ctx, records)
        records += replayed
    references: list[dict] = []
    if params.include_references or params.mode == "sft":
        references = [{**r, "source": "reference"} for r in read_jsonl(ctx.ws.references, required=("prompt", "completion"))]
    budget = training_budget(len(records), len(references), mode=params.mode, steps=params.steps, epochs=params.epochs,
                             reference_fraction=params.reference_fraction, batch_size=params.batch_size)
    records += random.Random(seed).sample(references, budget.references) if budget.references < len(references) \
        else references
    examples = [Example(prompt=r["prompt"], completion=r["completion"]) for r in records]
    stats = train_causal_lm(
        model, tokenizer, examples, steps=budget.steps, batch_size=params.batch_size, lr=params.lr,
        warmup_steps=params.warmup_steps, seed=seed, progress=ctx.progress, checkpoint=checkpoint,
        micro_batch_size=params.micro_batch_size, gradient_checkpointing=params.gradient_checkpointing,
        encode_prompt=encode_prompt, bf16=use_bf16(params.mixed_precision, model),
    )
    sources: dict[str, int] = {}
    for record in records:
        sources[record["source"]] = sources.get(record["source"], 0) + 1
    return {"examples": sources, "replay": replay, "steps": stats.steps, "budget": budget.reason,
            "references_available": len(references), "tokens": stats.tokens,
            "padding_share": round(stats.padding_share, 4), "packed": stats.packed,
            "mixed_precision": "bf16" if stats.bf16 else "fp32",
            "tokens_per_s": round(stats.tokens_per_s, 1), "first_loss": stats.first_loss,
            "final_loss": stats.final_loss,
            "untrained_reason": "train.steps is 0" if params.steps == 0 else
            "the batch has no new examples (positives, fixes or unsolved references)" if params.mode == "rft"
            else "the training set is empty"}


@dataclass(frozen=True)
class Budget:
    steps: int
    references: int  # how many of the warm-start references ride along
    reason: str  # how the step count was reached, for the stage metrics


def training_budget(new: int, references: int, *, mode: str, steps: int | None, epochs: float,
                    reference_fraction: float | None, batch_size: int) -> Budget:
    """How many references join the training mix and how many steps train on it.

    ``new`` counts the batch's examples (positives, fixes, unsolved references) and the replayed ones.
    In rft the references are capped at ``reference_fraction`` of the mix, so with nothing new there
    is nothing to train on (references alone would be the sft control); None keeps all of them. In
    sft the references are the whole mix. The steps are ``steps`` when set (an explicit override),
    otherwise ``epochs`` passes over the mix: the budget follows what the batch brought.
    """
    if mode == "sft" or reference_fraction is None:
        kept = references
    else:
        kept = min(references, math.floor(new * reference_fraction / (1 - reference_fraction)))
    total = (0 if mode == "sft" else new) + kept
    if steps is not None:
        return Budget(steps if total else 0, kept, f"train.steps: {steps}")
    planned = math.ceil(epochs * total / batch_size)
    return Budget(planned, kept, f"{epochs:g} epochs of {total} examples at batch {batch_size}")


def replay_positives(ctx: StageContext, current: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """Positives of the batches saved as the experiments in ``train.replay.versions``, read through
    DVC; see :func:`select_replay` for which are kept."""

    replay = ctx.params.train.replay
    if not replay.versions or replay.max_fraction == 0:
        return [], {}
    dvc = DvcWorkspace(ctx.ws.root)
    batches = {}
    for version in replay.versions:
        try:
            text = dvc.read_at(TRAIN_SET, version)
        except DvcError as error:
            raise StageError(f"train.replay.versions: {error}") from None
        batches[version] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                batches[version].append(json.loads(line))
            except ValueError as error:
                raise StageError(f"train.replay.versions: experiment {version!r}, {TRAIN_SET}:{number}: not valid "
                                 f"JSON ({error})") from None
    return select_replay(current, batches, replay.max_fraction)


def select_replay(current: list[dict], batches: dict[str, list[dict]],
                  max_fraction: float) -> tuple[list[dict], dict[str, int]]:
    """The earlier batches' positives not already in ``current``, the most recent version first,
    capped so that replayed / (current + replayed) <= ``max_fraction``.

    ``batches`` maps each version, oldest first, to its training-set records. Returns the records
    (source "replay", origin "<version>:<sample>") and how many came from each version.
    """
    seen = {(r["prompt"], r["completion"]) for r in current}
    cap = int(len(current) * max_fraction / (1 - max_fraction))
    kept: list[dict] = []
    mix = {version: 0 for version in batches}
    for version in reversed(list(batches)):
        for row in batches[version]:
            key = (row["prompt"], row["completion"])
            if len(kept) >= cap:
                break
            if row.get("source") == "positive" and key not in seen:
                seen.add(key)
                kept.append({**row, "source": "replay", "origin": f"{version}:{row.get('origin', '')}"})
                mix[version] += 1
    return kept, mix


def _train_grpo(ctx: StageContext, model, tokenizer, seed: int, checkpoint, encode_prompt) -> dict:
    """grpo over ``train.grpo.rounds`` generations (closedloop.stages.onpolicy): round 1 on the sample
    stage's samples, each later round on samples drawn from the policy as trained so far."""
    from dataclasses import replace

    params = ctx.params.train
    rounds = params.grpo.rounds
    tasks = load_tasks(ctx.ws.tasks)
    task_of = {task.task_id: task for task in tasks}
    parts = round_parts([task.task_id for task in tasks], rounds, seed) if rounds > 1 else [list(task_of)]
    if rounds > 1 and params.lora.enabled:
        raise StageError("train.grpo.rounds > 1 with train.lora.enabled: the rounds' samplers load the policy as "
                         "trained so far, which needs merged weights; use train.grpo.rounds: 1 with LoRA")
    base = ctx.ws.candidate.with_name("candidate.checkpoint")
    store = RoundStore(base, None if checkpoint is None else {**checkpoint.identity, "rounds": rounds})
    prompt_record = prompt_format_of(ctx.params, tokenizer).record(tokenizer)
    round_stats, round_rows, resumed = [], [], 0
    totals = {"rollouts": 0, "infra": 0, "cut": 0}
    # One optimizer and schedule over every round, planned for every task's k samples (groups without
    # a reward spread drop out, so the schedule ends a little short of its end).
    carry = None if rounds == 1 else Carry(total_steps=sum(
        math.ceil(params.grpo.epochs * len(part) * ctx.params.sample.k / params.batch_size) for part in parts))
    for number, part in enumerate(parts, start=1):
        saved = (store.load(number, model, carry, params.grpo.lr, params.warmup_steps) if number < rounds
                 else None)
        if saved is not None:
            figures, rows = saved
            round_stats.append(GrpoStats(**figures["stats"]))
            round_rows += rows
            for key in totals:
                totals[key] += figures[key]
            resumed = number
            continue
        if number == 1:
            batch, infra, cut = _stage_rollouts(ctx, set(part))
            rows = []
        else:
            rows = sample_and_score(ctx, store.policy_dir(number - 1), [task_of[task_id] for task_id in part],
                                    round_number=number, seed=ctx.seed(f"train/round-{number}"))
            batch, infra, cut = _round_rollouts(rows, {task_id: task_of[task_id].prompt for task_id in part}, params)
        counts = {"rollouts": len(batch), "infra": infra, "cut": cut}
        for key in totals:
            totals[key] += counts[key]
        stats = train_grpo_batch(ctx, model, tokenizer, batch, seed=seed + number - 1, encode_prompt=encode_prompt,
                                 carry=carry,
                                 checkpoint=checkpoint if rounds == 1 or checkpoint is None else replace(
                                     checkpoint, directory=base / f"round-{number}",
                                     identity={**checkpoint.identity, "round": number}))
        round_stats.append(stats)
        round_rows += rows
        if number < rounds:
            store.save(number, model, tokenizer, ctx.params.sample, prompt_record,
                       {"stats": figures_of(stats), **counts}, rows, carry)
    if rounds > 1:
        store.clear()
    write_jsonl(ctx.ws.train_rounds, round_rows)
    stats = combine_stats(round_stats)
    batch_size = totals["rollouts"]
    if not batch_size:
        why = (f"no rollouts to train on ({totals['infra']} infra errors left out)" if totals["infra"]
               else "no rollouts to train on")
    elif stats.skipped_groups == stats.groups:
        why = f"no group had a reward spread ({stats.skipped_groups} groups skipped)"
    else:
        why = (f"no rollout left to train on ({stats.skipped_groups} of {stats.groups} groups had no reward "
               "spread; the others only empty completions)")
    return {"examples": {"rollout": stats.rollouts}, "groups": stats.groups, "skipped_groups": stats.skipped_groups,
            "infra_errors_left_out": totals["infra"], "steps": stats.steps, "tokens": stats.tokens,
            "tokens_per_s": round(stats.tokens_per_s, 1), "first_loss": stats.first_loss,
            "final_loss": stats.final_loss, "clip_fraction": round(stats.clip_fraction, 4),
            "initial_log_ratio": stats.initial_log_ratio, "behaviour_logprobs": stats.behaviour_logprobs,
            "logprob_delta_mean": stats.logprob_delta_mean, "logprob_delta_max": stats.logprob_delta_max,
            # What TRL and verl log for GRPO (training/grpo.py); the per-step records go into the
            # candidate's closedloop_training.json.
            "frac_reward_zero_std": round(stats.zero_std_share, 6), "advantage_mean": round(stats.advantage_mean, 6),
            "advantage_std": round(stats.advantage_std, 6),
            "completion_length_mean": round(stats.completion_length_mean, 2),
            "truncated_share": round(totals["cut"] / batch_size, 6) if batch_size else None,
            # On-policy rounds: how many, and each round's samples' pass rate (the policy's, as it trained).
            "rounds": rounds, "rounds_resumed": resumed,
            **({"round_pass_rates": _round_pass_rates(round_rows)} if rounds > 1 else {}),
            **stats.run_figures(), "steps_log": stats.steps_log,
            "untrained_reason": why}


def train_grpo_batch(ctx: StageContext, model, tokenizer, batch: list, *, seed: int, encode_prompt, checkpoint,
                     carry=None):
    """One grpo run over ``batch`` (Rollouts) with the stage's settings."""

    params = ctx.params.train
    grpo = params.grpo
    return train_grpo(
        model, tokenizer, batch, epochs=grpo.epochs, batch_size=params.batch_size, lr=grpo.lr,
        warmup_steps=params.warmup_steps, clip=grpo.clip, beta=grpo.beta, scale_advantages=grpo.scale_advantages,
        negative_weight=grpo.negative_weight, loss=grpo.loss, clip_high=grpo.epsilon_high,
        max_completion_length=ctx.params.sample.max_new_tokens, carry=carry,
        temperature=ctx.params.sample.temperature, seed=seed, progress=ctx.progress, checkpoint=checkpoint,
        micro_batch_size=params.micro_batch_size, gradient_checkpointing=params.gradient_checkpointing,
        encode_prompt=encode_prompt,
    )


def _stage_rollouts(ctx: StageContext, task_ids: set[str]) -> tuple[list, int, int]:
    """The sample stage's samples of ``task_ids`` as Rollouts with their shaped rewards; infra errors
    (neither the model's failure nor its success) left out and counted, and the completions cut at
    sample.max_new_tokens counted."""

    params = ctx.params.train
    prompts = {task.task_id: task.prompt for task in load_tasks(ctx.ws.tasks)}
    samples = read_jsonl(ctx.ws.samples, required=("sample_id", "task_id"))
    rewards = {r["sample_id"]: r for r in read_jsonl(ctx.ws.rewards, required=("sample_id", "reward", "steps", "status"))}
    # "logprobs" is null where the sampling backend returns none: the trainer computes them.
    rollouts = {r["sample_id"]: r for r in read_jsonl(ctx.ws.rollouts, required=("sample_id", "token_ids"))}
    batch, infra, cut = [], 0, 0
    for sample in samples:
        sample_id = sample["sample_id"]
        if sample_id not in rewards or sample_id not in rollouts:
            raise StageError(f"{ctx.ws.rewards} / {ctx.ws.rollouts}: no reward or rollout for sample {sample_id}")
        if sample["task_id"] not in task_ids:
            continue
        reward = rewards[sample_id]
        if reward["status"] == "infra_error":
            infra += 1
            continue
        rollout = rollouts[sample_id]
        cut += sample.get("finish_reason") == "length"  # stopped by sample.max_new_tokens, not by the model
        batch.append(Rollout(group=sample["task_id"], prompt=prompts[sample["task_id"]],
                             token_ids=tuple(rollout["token_ids"]),
                             logprobs=None if rollout.get("logprobs") is None else tuple(rollout["logprobs"]),
                             reward=shaped_reward(reward["reward"], reward["steps"], params.shaping,
                                                    reward.get("passed"))))
    return batch, infra, cut


def _round_rollouts(rows: list[dict], prompts: dict[str, str], params) -> tuple[list, int, int]:
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


def _round_pass_rates(rows: list[dict]) -> dict[str, float]:
    """Each on-policy round's share of passing samples: the policy's own pass rate as it trained."""
    by_round: dict[int, list[bool]] = {}
    for row in rows:
        by_round.setdefault(row["round"], []).append(bool(row["scored"]["passed"]))
    return {f"round_{number}": round(sum(v) / len(v), 6) for number, v in sorted(by_round.items())}


def _file_hash(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
