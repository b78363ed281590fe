"""Stage warmstart (iteration 0): build or load the base policy, SFT it on reference solutions,
and measure it on the benchmark. Its result becomes the first champion."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from closedloop.envs import get_env
from closedloop.io import write_json, write_jsonl
from closedloop.stages.common import StageContext, load_tasks, sandbox_pool

BUILTIN_PREFIX = "builtin:"


def run(ctx: StageContext) -> dict:
    from closedloop.evaluation.runner import evaluate_policy
    from closedloop.models.loading import load_policy, save_policy
    from closedloop.models.settings import save_settings
    from closedloop.training.causal_lm import Example, train_causal_lm

    params = ctx.params
    env = get_env("code", params)
    # Seeds here ignore the iteration: the warm start is the same whichever iteration reruns it.
    references = env.generate(params.warmstart.n_references, seed=params.stage_seed("references", False), split="train")
    write_jsonl(ctx.ws.references, (
        {"task_id": t.task_id, "kind": t.kind, "prompt": t.prompt, "completion": t.reference} for t in references
    ))

    with tempfile.TemporaryDirectory() as scratch:
        base_dir = resolve_base_model(ctx, env, Path(scratch))
        model, tokenizer = load_policy(base_dir)
    examples = [Example(prompt=t.prompt, completion=t.reference) for t in references]
    stats = train_causal_lm(
        model, tokenizer, examples, steps=params.warmstart.steps, batch_size=params.warmstart.batch_size,
        lr=params.warmstart.lr, warmup_steps=params.warmstart.warmup_steps,
        seed=params.stage_seed("warmstart", False), progress=ctx.progress,
    )
    staging = ctx.ws.warmstart_model.with_name("warmstart.staging")
    shutil.rmtree(staging, ignore_errors=True)
    save_policy(model, tokenizer, staging)
    save_settings(staging, params.sample)
    shutil.rmtree(ctx.ws.warmstart_model, ignore_errors=True)
    staging.rename(ctx.ws.warmstart_model)

    with sandbox_pool(params) as pool:
        evaluation = evaluate_policy(
            ctx.ws.warmstart_model, load_tasks(ctx.ws.benchmark_tasks), settings=params.sample,
            samples_per_task=params.evaluate.samples_per_task, seed=params.stage_seed("evaluate", False),
            batch_size=params.evaluate.batch_size, env_for=lambda name: get_env(name, params), pool=pool,
            progress=ctx.progress,
        )
    write_json(ctx.ws.warmstart_eval, evaluation)
    return {
        "base_model": params.model.name_or_path,
        "references": len(references),
        "train_steps": stats.steps,
        "train_tokens_per_s": round(stats.tokens_per_s, 1),
        "first_loss": stats.first_loss,
        "final_loss": stats.final_loss,
        "benchmark_pass@1": evaluation["summary"]["overall"]["pass@1"],
        "model_version": evaluation["model_version"],
    }


def resolve_base_model(ctx: StageContext, env, scratch: Path) -> Path | str:
    """`builtin:tiny` is built here from params (no downloads); anything else is a local Hugging Face
    directory or a hub id, loaded as it is."""
    from closedloop.models.builtin import create_builtin

    name = ctx.params.model.name_or_path
    if not name.startswith(BUILTIN_PREFIX):
        return name
    if name != "builtin:tiny":
        from closedloop.stages.common import StageError

        raise StageError(f"params.yaml model.name_or_path: unknown builtin {name!r}; the builtin is 'builtin:tiny'")
    corpus_tasks = env.generate(ctx.params.warmstart.tokenizer_corpus_tasks,
                                seed=ctx.params.stage_seed("tokenizer", False), split="train")
    corpus = [t.prompt + t.reference for t in corpus_tasks]
    return create_builtin(ctx.params.model.builtin, corpus, scratch / "base", seed=ctx.params.stage_seed("init", False))
