"""Sampling tokens/s side by side, one run: the hf backend, raw model.generate, openai over transformers serve.

The same prompts (the benchmark's), the same settings (params.yaml's sample section: k, temperature,
top_p, max_new_tokens, stop) and the same model for all three. The model is the built-in
architecture at params.yaml's size, random-initialised unless --model names a directory (a warm
start, say: data/models/warmstart after `make run`). Baseline: raw ``model.generate`` (transformers'
own decoding loop with a DynamicCache, stop strings and k return sequences per prompt).

    python benchmarks/sampling.py                       # CPU, ~3 min on 2 cores
    python benchmarks/sampling.py --prompts 32 --skip-openai
    python benchmarks/sampling.py --device cuda --dtype bfloat16 --skip-openai   # where a GPU is lent
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from closedloop.models.prompts import resolve_stop  # noqa: E402  (pure: no heavy imports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model directory; default: a random built-in at params.yaml's size")
    parser.add_argument("--prompts", type=int, default=64, help="benchmark prompts sampled (k each)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--concurrency", type=int, default=8, help="openai backend: requests in flight")
    parser.add_argument("--skip-openai", action="store_true")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    from closedloop.config import parse_params

    params = parse_params({"model": {"device": args.device, "dtype": args.dtype}})
    prompts = benchmark_prompts(params, args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else random_builtin(params, Path(tmp) / "model")
        s = params.sample
        stop = list(resolve_stop(s.stop, "raw"))
        print(f"{len(prompts)} prompts x k={s.k}, temperature {s.temperature}, max_new_tokens {s.max_new_tokens}, "
              f"stop {stop!r}; model {model_dir if args.model else 'random built-in'}\n")
        figures = {"generate": raw_generate(params, model_dir, prompts), "hf": backend(params, model_dir, prompts)}
        if not args.skip_openai:
            served = parse_params({**params.model_dump(mode="json"), "sample": {
                **params.sample.model_dump(mode="json"),
                "backend": {"name": "openai", "concurrency": args.concurrency}, "server": {"managed": True}}})
            figures["openai"] = backend(served, model_dir, prompts)
    base = figures["generate"]["tokens_per_s"]
    print(f"{'sampler':<34} {'tokens':>8} {'wall s':>8} {'tokens/s':>9} {'vs generate':>12}")
    names = {"generate": "model.generate (baseline)", "hf": "hf backend (closedloop decoder)",
             "openai": f"openai -> transformers serve (c={args.concurrency})"}
    for key, row in figures.items():
        print(f"{names[key]:<34} {row['tokens']:>8} {row['wall_s']:>8.2f} {row['tokens_per_s']:>9.0f} "
              f"{row['tokens_per_s'] / base:>11.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


def benchmark_prompts(params, n: int) -> list[str]:
    """The first n benchmark tasks' prompts, spread over the environments."""
    from closedloop.envs import get_env

    names = params.envs.active()
    per_env = max(1, n // len(names))
    prompts = []
    for name in names:
        prompts += [task.prompt for task in get_env(name, params).generate(per_env, seed=1, split="benchmark",
                                                                           slice="core")]
    return prompts[:n]


def random_builtin(params, out: Path) -> Path:
    from closedloop.models.builtin import create_builtin
    from closedloop.stages.warmstart import mixed_tasks

    corpus = [t.prompt + t.reference for t in mixed_tasks(params, params.warmstart.tokenizer_corpus_tasks, "tokenizer")]
    create_builtin(params.model.builtin, corpus, out, seed=0)
    return out


def raw_generate(params, model_dir: Path, prompts: list[str]) -> dict:
    """transformers' generate(), batched as the hf backend batches (batch_size sequences at once)."""
    import torch

    from closedloop.models.loading import load_policy

    model, tokenizer = load_policy(model_dir, device=params.model.device, dtype=params.model.dtype)
    s = params.sample
    stop = list(resolve_stop(s.stop, "raw"))
    per_batch = max(1, s.batch_size // s.k)
    tokens = 0
    started = time.perf_counter()
    torch.manual_seed(0)
    with torch.inference_mode():
        for first in range(0, len(prompts), per_batch):
            batch = tokenizer(prompts[first : first + per_batch], return_tensors="pt", padding=True).to(model.device)
            out = model.generate(**batch, do_sample=s.temperature > 0, temperature=s.temperature or None,
                                 top_p=s.top_p, top_k=0, max_new_tokens=s.max_new_tokens,
                                 num_return_sequences=s.k, stop_strings=stop, tokenizer=tokenizer,
                                 pad_token_id=tokenizer.pad_token_id)
            new = out[:, batch["input_ids"].shape[1]:]
            tokens += int((new != tokenizer.pad_token_id).sum())
    wall = time.perf_counter() - started
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def backend(params, model_dir: Path, prompts: list[str]) -> dict:
    from closedloop.sampling.base import open_sampler

    opened = time.perf_counter()
    with open_sampler(params, model_dir) as sampler:
        ready = time.perf_counter() - opened
        results, stats = sampler.sample(prompts, k=params.sample.k, seed=0, batch_size=params.sample.batch_size)
    return {"tokens": stats.completion_tokens, "wall_s": stats.wall_s, "tokens_per_s": stats.tokens_per_s,
            "startup_s": ready}


if __name__ == "__main__":
    main()
