"""Stage benchmark: the fixed benchmark set, per environment and slice (core, edge, failure_modes).

Generated once from the project seed (never the iteration) or read whole from an environment's
``benchmark_file``; DVC keeps the file, so nothing regenerates it silently.
"""

from __future__ import annotations

from collections import Counter

from closedloop.envs import get_env
from closedloop.envs.base import SLICES
from closedloop.envs.taskfile import tasks_for
from closedloop.io import write_jsonl
from closedloop.stages.common import StageContext, StageError


def run(ctx: StageContext) -> dict:
    params = ctx.params
    tasks = []
    for name in params.envs.active():
        section = params.envs.section(name)
        env = get_env(name, params)
        for slice in SLICES:
            size = getattr(section.benchmark, slice)
            if size or section.benchmark_file:
                tasks += tasks_for(env, section, size, seed=params.project.seed, split="benchmark", slice=slice)
    repeated = [task_id for task_id, count in Counter(t.task_id for t in tasks).items() if count > 1]
    if repeated:
        raise StageError(f"benchmark: task ids {repeated[:3]} appear more than once")
    write_jsonl(ctx.ws.benchmark_tasks, (t.to_record() for t in tasks))
    return {"tasks": len(tasks), "per_slice": dict(sorted(Counter(f"{t.env}/{t.slice}" for t in tasks).items()))}
