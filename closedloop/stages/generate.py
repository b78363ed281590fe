"""Stage generate: fresh training tasks for this iteration, disjoint from the benchmark."""

from __future__ import annotations

from collections import Counter

from closedloop.envs import get_env
from closedloop.io import write_jsonl
from closedloop.stages.common import StageContext


def run(ctx: StageContext) -> dict:
    env = get_env("code", ctx.params)
    tasks = env.generate(ctx.params.generate.n_tasks, seed=ctx.seed("generate"), split="train")
    write_jsonl(ctx.ws.tasks, (t.to_record() for t in tasks))
    return {"tasks": len(tasks), "per_kind": dict(sorted(Counter(t.kind for t in tasks).items()))}
