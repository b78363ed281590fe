"""Stage benchmark: generate the fixed benchmark set once; DVC keeps it, nothing regenerates it silently."""

from __future__ import annotations

from collections import Counter

from closedloop.envs import get_env
from closedloop.io import write_jsonl
from closedloop.stages.common import StageContext


def run(ctx: StageContext) -> dict:
    env = get_env("code", ctx.params)
    # The benchmark seed depends on the project seed only, never on the iteration.
    tasks = env.generate(ctx.params.envs.code.benchmark_tasks, seed=ctx.params.project.seed, split="benchmark")
    write_jsonl(ctx.ws.benchmark_tasks, (t.to_record() for t in tasks))
    return {"tasks": len(tasks), "per_slice": dict(Counter(f"{t.env}/{t.slice}" for t in tasks))}
