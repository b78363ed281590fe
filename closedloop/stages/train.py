"""Stage train: rejection-sampling fine-tuning from the champion on the verified batch → candidate."""

from __future__ import annotations

import shutil

from closedloop.io import read_json, read_jsonl
from closedloop.stages.common import StageContext, StageError


def run(ctx: StageContext) -> dict:
    from closedloop.models.loading import load_policy, model_fingerprint, save_policy
    from closedloop.models.settings import save_settings
    from closedloop.training.causal_lm import Checkpointing, Example, ResumeRefused, train_causal_lm

    report = read_json(ctx.ws.validation_report)
    if not report.get("success"):
        raise StageError(f"{ctx.ws.validation_report}: the batch failed validation; refusing to train on it")
    params = ctx.params.train
    records = read_jsonl(ctx.ws.train_set, required=("source", "prompt", "completion"))
    if params.include_references:
        records += [{**r, "source": "reference"} for r in read_jsonl(ctx.ws.references, required=("prompt", "completion"))]
    examples = [Example(prompt=r["prompt"], completion=r["completion"]) for r in records]

    model, tokenizer = load_policy(ctx.ws.champion)
    seed = ctx.seed("train")
    checkpoint = None
    if params.checkpoint_every:
        # What this training run is: a checkpoint of any other run is refused, naming what changed.
        identity = {"batch (train_set.jsonl)": _file_hash(ctx.ws.train_set),
                    "references": _file_hash(ctx.ws.references) if params.include_references else None,
                    "champion": model_fingerprint(ctx.ws.champion), "seed": seed,
                    **{f"params train.{key}": value for key, value in params.model_dump(mode="json").items()
                       if key != "checkpoint_every"}}
        checkpoint = Checkpointing(ctx.ws.candidate.with_name("candidate.checkpoint"), params.checkpoint_every, identity)
    try:
        stats = train_causal_lm(
            model, tokenizer, examples, steps=params.steps, batch_size=params.batch_size, lr=params.lr,
            warmup_steps=params.warmup_steps, seed=seed, progress=ctx.progress, checkpoint=checkpoint,
        )
    except ResumeRefused as error:
        raise StageError(str(error)) from None
    staging = ctx.ws.candidate.with_name("candidate.staging")
    shutil.rmtree(staging, ignore_errors=True)
    save_policy(model, tokenizer, staging)
    save_settings(staging, ctx.params.sample)  # the rollouts it learned from were sampled with these
    shutil.rmtree(ctx.ws.candidate, ignore_errors=True)
    staging.rename(ctx.ws.candidate)
    sources = {}
    for record in records:
        sources[record["source"]] = sources.get(record["source"], 0) + 1
    return {
        "mode": "rft",
        "examples": sources,
        "steps": stats.steps,
        "tokens": stats.tokens,
        "tokens_per_s": round(stats.tokens_per_s, 1),
        "first_loss": stats.first_loss,
        "final_loss": stats.final_loss,
        "parent_version": model_fingerprint(ctx.ws.champion),
        "model_version": model_fingerprint(ctx.ws.candidate),
    }


def _file_hash(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
