"""Stage warmstart (iteration 0): build or load the base policy, SFT it on reference solutions,
and measure it on the benchmark. Its result becomes the first champion.

With ``warmstart.lora`` a real model is fine-tuned through LoRA adapters (``train.lora``'s rank,
alpha, dropout and target modules), merged into the weights before saving. The built-in is refused:
it starts from random weights, which only full training turns into a policy (low-rank updates of a
random network leave it random). ``train.micro_batch_size`` and ``train.gradient_checkpointing``
apply here too: they are memory settings of the machine, not of one stage. So does
``train.mixed_precision``, which changes the result (a warmstart param in dvc.yaml).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from functools import partial
from pathlib import Path

from closedloop.envs import get_env
from closedloop.envs.base import load_tasks
from closedloop.envs.taskfile import tasks_for
from closedloop.evaluation.runner import evaluate_policy
from closedloop.io import write_json, write_jsonl
from closedloop.models.builtin import create_builtin
from closedloop.models.loading import load_policy, save_policy
from closedloop.models.settings import save_settings
from closedloop.rewards.pools import EnvPools
from closedloop.stages.common import StageContext, StageError, env_mix
from closedloop.stages.prompting import prompt_format_of
from closedloop.training.causal_lm import Example, train_causal_lm, use_bf16
from closedloop.training.lora import merged, with_seeded_lora
from closedloop.training.optimization import run_settings

BUILTIN_PREFIX = "builtin:"


def run(ctx: StageContext) -> dict:
    params = ctx.params
    if params.warmstart.lora and params.model.name_or_path.startswith(BUILTIN_PREFIX):
        raise StageError(
            "warmstart.lora is true but model.name_or_path is the built-in, which starts from random "
            "weights: LoRA adapters on a random network cannot make it a policy. Set warmstart.lora: false "
            "(the built-in trains in full), or name a pretrained model in model.name_or_path")
    # Seeds here ignore the iteration: the warm start is the same whichever iteration reruns it.
    references = mixed_tasks(params, params.warmstart.n_references, "references")
    write_jsonl(ctx.ws.references, (
        {"task_id": t.task_id, "env": t.env, "kind": t.kind, "prompt": t.prompt, "completion": t.reference}
        for t in references
    ))

    with tempfile.TemporaryDirectory() as scratch:
        base_dir = resolve_base_model(ctx, Path(scratch))
        model, tokenizer = load_policy(base_dir, device=params.model.device, dtype=params.model.dtype)
    seed = params.stage_seed("warmstart", False)
    if params.warmstart.lora:
        model = _with_lora(model, params.train.lora, seed)
    prompt_format = prompt_format_of(params, tokenizer)
    examples = [Example(prompt=t.prompt, completion=t.reference) for t in references]
    stats = train_causal_lm(
        model, tokenizer, examples, steps=params.warmstart.steps, batch_size=params.warmstart.batch_size,
        lr=params.warmstart.lr, warmup_steps=params.warmstart.warmup_steps,
        bf16=use_bf16(params.train.mixed_precision, model),
        **run_settings(params.train, seed=seed, progress=ctx.progress, encode_prompt=partial(prompt_format.encode, tokenizer)),
    )
    if params.warmstart.lora:
        model = merged(model)
    staging = ctx.ws.warmstart_model.with_name("warmstart.staging")
    shutil.rmtree(staging, ignore_errors=True)
    save_policy(model, tokenizer, staging)
    save_settings(staging, params.sample, prompt_format.record(tokenizer))
    shutil.rmtree(ctx.ws.warmstart_model, ignore_errors=True)
    staging.rename(ctx.ws.warmstart_model)

    with EnvPools(params) as verifiers:
        evaluation = evaluate_policy(
            ctx.ws.warmstart_model, load_tasks(ctx.ws.benchmark_tasks), params=params,
            samples_per_task=params.evaluate.samples_per_task, seed=params.stage_seed("evaluate", False),
            batch_size=params.evaluate.batch_size, verifiers=verifiers, progress=ctx.progress,
        )
    write_json(ctx.ws.warmstart_eval, evaluation)
    return {
        "base_model": params.model.name_or_path,
        "references": len(references),
        "references_per_env": dict(sorted(Counter(t.env for t in references).items())),
        "train_steps": stats.steps,
        "lora": params.warmstart.lora,
        "train_tokens_per_s": round(stats.tokens_per_s, 1),
        "train_padding_share": round(stats.padding_share, 4),
        "train_packed": stats.packed,
        "train_mixed_precision": "bf16" if stats.bf16 else "fp32",
        "first_loss": stats.first_loss,
        "final_loss": stats.final_loss,
        "benchmark_pass@1": evaluation["summary"]["overall"]["pass@1"],
        **{f"benchmark_pass@1/{name}": figures["pass@1"] for group in ("envs", "slices")
           for name, figures in evaluation["summary"][group].items()},
        "model_version": evaluation["model_version"],
    }


def _with_lora(model, lora, seed: int):
    """``model`` with fresh adapters, initialised from ``seed`` without touching the global stream."""
    try:
        return with_seeded_lora(model, lora, seed)
    except ValueError as error:
        raise StageError(str(error)) from None


def mixed_tasks(params, total: int, purpose: str) -> list:
    """``total`` training tasks over the active environments by share (their references are known good)."""
    tasks = []
    for name, count in env_mix(params, total).items():
        env = get_env(name, params)
        tasks += tasks_for(env, params.envs.section(name), count, seed=params.stage_seed(f"{purpose}/{name}", False),
                           split="train")
    return tasks


def resolve_base_model(ctx: StageContext, scratch: Path) -> Path | str:
    """`builtin:tiny` is built here from params (no downloads); anything else is a local Hugging Face
    directory or a hub id, loaded as it is."""

    name = ctx.params.model.name_or_path
    if not name.startswith(BUILTIN_PREFIX):
        return name
    if name != "builtin:tiny":
        raise StageError(f"params.yaml model.name_or_path: unknown builtin {name!r}; the builtin is 'builtin:tiny'")
    corpus_tasks = mixed_tasks(ctx.params, ctx.params.warmstart.tokenizer_corpus_tasks, "tokenizer")
    corpus = [t.prompt + t.reference for t in corpus_tasks]
    return create_builtin(ctx.params.model.builtin, corpus, scratch / "base", seed=ctx.params.stage_seed("init", False))
