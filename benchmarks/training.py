"""Training tokens/s of a 0.5B-size model built from a config (no download), on a device and dtype.

A Qwen2-architecture model at Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads over 2 key/value
heads, MLP 4864; a 32k vocabulary instead of 151k, since its tokenizer is trained here) with random
weights, trained for a few steps through closedloop's own trainer (train_causal_lm: AdamW, warm-up,
clipping, micro-batches, activation checkpointing) on benchmark prompts and references. Baseline:
the same run on the CPU in float32, the figure in docs/benchmarks.md.

    python benchmarks/training.py --steps 3                                   # CPU float32 (~2 min on 2 cores)
    python benchmarks/training.py --device cuda --dtype bfloat16 --steps 20   # where a GPU is lent
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
         "intermediate_size": 4864, "max_position_embeddings": 2048, "tie_word_embeddings": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=0)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--baseline", type=float, help="tokens/s to print the ratio against (e.g. the CPU figure)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    import torch

    from closedloop.config import parse_params
    from closedloop.models.loading import load_policy
    from closedloop.stages.warmstart import mixed_tasks
    from closedloop.training.causal_lm import Example, train_causal_lm

    params = parse_params({})
    tasks = mixed_tasks(params, 200, "tokenizer")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        model_dir = build(Path(tmp) / "model", [t.prompt + t.reference for t in tasks], args.vocab_size)
        model, tokenizer = load_policy(model_dir, device=args.device, dtype=args.dtype)
        built = time.perf_counter() - started
    parameters = sum(p.numel() for p in model.parameters())
    examples = [Example(t.prompt, t.reference) for t in tasks]
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    stats = train_causal_lm(model, tokenizer, examples, steps=args.steps, batch_size=args.batch_size, lr=1e-5,
                            warmup_steps=0, seed=0, micro_batch_size=args.micro_batch_size,
                            gradient_checkpointing=args.gradient_checkpointing)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    figures = {"parameters": parameters, "device": str(model.device), "dtype": str(next(model.parameters()).dtype),
               "steps": stats.steps, "batch_size": args.batch_size, "micro_batch_size": args.micro_batch_size,
               "gradient_checkpointing": args.gradient_checkpointing, "tokens": stats.tokens,
               "wall_s": round(stats.wall_s, 2), "tokens_per_s": round(stats.tokens_per_s, 1),
               "first_loss": stats.first_loss, "final_loss": stats.final_loss, "build_and_load_s": round(built, 1),
               "peak_gpu_gib": None if peak is None else round(peak, 2)}
    for key, value in figures.items():
        print(f"{key:<24} {value}")
    if args.baseline:
        print(f"{'vs baseline':<24} {stats.tokens_per_s / args.baseline:.1f}x ({args.baseline} tokens/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


def build(out: Path, corpus: list[str], vocab_size: int) -> Path:
    """A random Qwen2 at 0.5B's shape, saved in bfloat16 like the published checkpoint."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from closedloop.models.builtin import train_tokenizer
    from closedloop.models.loading import save_policy

    tokenizer = train_tokenizer(corpus, vocab_size)
    # The embedding gets vocab_size rows however few the tokenizer trained here has, as a real one would.
    config = Qwen2Config(vocab_size=max(vocab_size, len(tokenizer)), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         torch_dtype="bfloat16", **SHAPE)
    with torch.device("cpu"):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    save_policy(model, tokenizer, out)
    return out


if __name__ == "__main__":
    main()
