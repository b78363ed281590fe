"""Stage generate: fresh training tasks for this iteration, from every active environment by its
share (or those ``generate.envs`` names), disjoint from the benchmark. A malformed task file stops the
stage before anything is written."""

from __future__ import annotations

from collections import Counter

from closedloop.envs import get_env
from closedloop.envs.taskfile import tasks_for
from closedloop.io import write_jsonl
from closedloop.stages.common import StageContext, env_mix


def run(ctx: StageContext) -> dict:
    params = ctx.params
    tasks = []
    for name, count in env_mix(params, params.generate.n_tasks, only=params.generate.envs).items():
        env = get_env(name, params)
        tasks += tasks_for(env, params.envs.section(name), count, seed=ctx.seed(f"generate/{name}"), split="train")
    write_jsonl(ctx.ws.tasks, (t.to_record() for t in tasks))
    return {"tasks": len(tasks), "per_env": dict(sorted(Counter(t.env for t in tasks).items())),
            "per_kind": dict(sorted(Counter(f"{t.env}/{t.kind}" for t in tasks).items()))}
