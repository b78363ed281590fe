"""Padded against packed training steps on a workspace's real training mix.

Baseline: the padded batches (``pack=False``). Trains the workspace's champion for ``--steps`` steps
on its batch's train set plus the warm-start references, once padded and once packed, from the same
weights and seed, and prints seconds per step, the padding share of the positions computed, tokens/s
on real tokens, the final loss (the same up to rounding) and the speed-up.

    python benchmarks/iteration.py --keep /tmp/ws     # a workspace with a batch and a champion
    python benchmarks/packing.py /tmp/ws --steps 40
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    from closedloop.io import read_jsonl
    from closedloop.models.loading import load_policy
    from closedloop.training.causal_lm import Example, train_causal_lm
    from closedloop.workspace import Workspace

    ws = Workspace.at(args.workspace)
    if not ws.champion.exists():
        raise SystemExit(f"{ws.champion}: no champion; run benchmarks/iteration.py --keep {args.workspace} first")
    records = (read_jsonl(ws.train_set) if ws.train_set.exists() else []) + read_jsonl(ws.references)
    examples = [Example(r["prompt"], r["completion"]) for r in records]
    print(f"{len(examples)} examples ({ws.train_set.name} and {ws.references.name}), {args.steps} steps of "
          f"{args.batch_size}")
    seconds = {}
    for pack in (False, True):
        model, tokenizer = load_policy(ws.champion, device="cpu", dtype="float32")
        stats = train_causal_lm(model, tokenizer, examples, steps=args.steps, batch_size=args.batch_size, lr=1e-3,
                                warmup_steps=5, seed=0, pack=pack)
        seconds[pack] = stats.wall_s
        print(f"{'packed' if pack else 'padded':<7} {stats.wall_s / stats.steps:.3f} s/step, padding "
              f"{stats.padding_share:.1%} of {stats.positions:,} positions, {stats.tokens_per_s:,.0f} real tokens/s, "
              f"final loss {stats.final_loss:.4f}" + ("" if stats.packed == pack else " (packing refused)"))
    print(f"speed-up packed / padded: {seconds[False] / seconds[True]:.2f}x")


if __name__ == "__main__":
    main()
