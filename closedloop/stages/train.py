"""Stage train: the candidate, trained from the champion in the mode params.yaml names.

The modes are closedloop.training.modes, looked up by ``train.mode``:

- ``sft``: the warm-start references only (a control: what training without the loop's data gives);
- ``rft``: rejection-sampling fine-tuning on the batch's positives and failure→fix pairs, the
  references, and the positives of earlier batches replayed through DVC;
- ``grpo``: group-relative policy optimisation on every sample of the batch, with the shaped reward.
  With ``train.grpo.rounds`` R > 1 it runs on-policy: the batch's tasks in R parts, each part after the
  first sampled from the policy as trained so far and scored by the reward stage's sources
  (closedloop.stages.onpolicy); those samples are the stage's output ``data/batch/train_rounds.jsonl``.

This stage does what every mode shares: it refuses an unvalidated batch, loads the champion (with
LoRA adapters under ``train.lora``), identifies the run for its checkpoints, and saves the candidate.
The mode, its settings and the data mix are written into the model directory
(``closedloop_training.json``) and into the stage metrics, from which lineage tags the model version.

A run that trained 0 steps (an empty training set, ``train.steps: 0``, a grpo batch in which no group
had a reward spread) still writes the candidate (the champion's weights: later stages need the
directory), but says so: ``"trained": false`` and ``"untrained_reason"`` in both. The gate then holds
it, and the version step registers no model version for it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from functools import partial
from pathlib import Path
from typing import Any

from closedloop.config import parse_params
from closedloop.execution.factory import open_executor, train_resources
from closedloop.io import read_json, write_jsonl
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.gitstate import DvcError
from closedloop.models.loading import load_policy, model_fingerprint, save_policy
from closedloop.models.settings import save_settings
from closedloop.stages.common import StageContext, StageError
from closedloop.stages.onpolicy import sample_and_score
from closedloop.stages.prompting import prompt_format_of
from closedloop.training.candidate_record import TRAINING_FILE
from closedloop.training.causal_lm import use_bf16
from closedloop.training.checkpoints import Checkpointing, ResumeRefused
from closedloop.training.lora import merged, with_seeded_lora
from closedloop.training.modes import TrainingModeError, training_mode
from closedloop.training.modes.base import (TrainingError, TrainingMode, TrainingResult, TrainingRun,
                                           checkpoint_directory)
from closedloop.workspace import Workspace

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
    try:
        mode = training_mode(params.mode)
        mode.check(ctx.params)
    except (TrainingModeError, TrainingError) as error:
        raise StageError(str(error)) from None
    inputs = mode.inputs(ctx.ws, params)

    model, tokenizer = load_policy(ctx.ws.champion, device=ctx.params.model.device, dtype=ctx.params.model.dtype)
    # Prompts are tokenised exactly as the sampler fed them (a chat template, or raw text).
    prompt_format = prompt_format_of(ctx.params, tokenizer)
    seed = ctx.seed("train")
    if params.lora.enabled:
        try:
            model = with_seeded_lora(model, params.lora, seed)
        except ValueError as error:
            raise StageError(str(error)) from None
    checkpoint = _checkpointing(ctx, mode, inputs, model, seed) if params.checkpoint_every else None
    run = TrainingRun(ws=ctx.ws, params=ctx.params, model=model, tokenizer=tokenizer, seed=seed,
                      encode_prompt=partial(prompt_format.encode, tokenizer),
                      prompt_record=prompt_format.record(tokenizer), checkpoint=checkpoint, progress=ctx.progress,
                      seed_of=ctx.seed, sample_round=partial(sample_and_score, ctx),
                      read_saved=partial(_read_saved, ctx.ws.root))
    try:
        result = mode.train(run)
    except (ResumeRefused, TrainingError) as error:
        raise StageError(str(error)) from None
    write_jsonl(ctx.ws.train_rounds, result.rounds)  # the on-policy rounds' samples; empty without rounds

    if params.lora.enabled:
        model = merged(model)
    return _save_candidate(ctx, mode, model, tokenizer, run.prompt_record, result)


def _checkpointing(ctx: StageContext, mode: TrainingMode, inputs: tuple[Path, ...], model: Any,
                   seed: int) -> Checkpointing:
    """Where the run's checkpoints go, and what this training run is: a checkpoint of any other run is
    refused, naming what changed."""
    params = ctx.params.train
    identity = {**{f"input {path.name}": _file_hash(path) for path in inputs},
                "champion": model_fingerprint(ctx.ws.champion), "seed": seed,
                "model dtype": str(next(model.parameters()).dtype),
                # auto resolves per machine: a checkpoint trained in bf16 is not resumed in float32
                "mixed precision": mode.mixed_precision and use_bf16(params.mixed_precision, model),
                **{f"params train.{key}": value for key, value in params.model_dump(mode="json").items()
                   if key != "checkpoint_every"}}
    return Checkpointing(checkpoint_directory(ctx.ws), params.checkpoint_every, identity)


def _save_candidate(ctx: StageContext, mode: TrainingMode, model: Any, tokenizer: Any, prompt_record: dict,
                    result: TrainingResult) -> dict:
    """Save the trained model as the candidate, with its sampling settings and training record; returns
    the stage's metrics."""
    params = ctx.params.train
    figures = result.figures
    trained = {"trained": figures["steps"] > 0, "untrained_reason": None if figures["steps"] > 0 else
               result.untrained_reason}  # the reason is used only when nothing was trained
    # grpo's per-step figures are the model's record, not metrics
    record = {"mode": mode.name, "parent_version": model_fingerprint(ctx.ws.champion),
              "iteration": ctx.params.loop.iteration, "params": params.model_dump(mode="json"),
              "data": figures["examples"], **trained,
              **({"steps_log": result.steps_log} if result.steps_log is not None else {})}
    staging = ctx.ws.candidate.with_name("candidate.staging")
    shutil.rmtree(staging, ignore_errors=True)
    save_policy(model, tokenizer, staging)
    # the rollouts it learned from were sampled with these settings and this prompt format
    save_settings(staging, ctx.params.sample, prompt_record)
    (staging / TRAINING_FILE).write_text(json.dumps(record, sort_keys=True, indent=2) + "\n")
    shutil.rmtree(ctx.ws.candidate, ignore_errors=True)
    staging.rename(ctx.ws.candidate)
    return {"mode": mode.name, **figures, **trained, "parent_version": record["parent_version"],
            "model_version": model_fingerprint(ctx.ws.candidate)}


def _read_saved(root: Path, path: str, version: str) -> str:
    """``path`` as the experiment ``version`` saved it, read through DVC; a DVC failure is the mode's to
    report (as a TrainingError)."""
    try:
        return DvcWorkspace(root).read_at(path, version)
    except DvcError as error:
        raise TrainingError(str(error)) from None


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
