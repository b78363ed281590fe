"""One Prefect task per DVC stage, built from the stage table. Each calls the same stage function as
`closedloop stage NAME`."""

from __future__ import annotations

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from closedloop.config import Params
from closedloop.pipeline import STAGES
from closedloop.stages.recorded import run_recorded


def _stage_task(name: str, retries: int = 0) -> Task:
    def run(workspace: str, params: Params, progress: bool = False) -> dict:
        return run_recorded(name, workspace, params, progress)

    run.__name__ = name
    return task(name=name, retries=retries, persist_result=False, cache_policy=NO_CACHE)(run)


STAGE_TASKS: dict[str, Task] = {spec.name: _stage_task(spec.name) for spec in STAGES}

# Callers also reach a task as an attribute (`stages.sample`); a stage named like one of this module's
# own names would shadow it, so refuse that here rather than break the import somewhere else.
_taken = sorted(set(STAGE_TASKS) & set(globals()))
if _taken:
    raise RuntimeError(f"stage names {_taken} clash with names in tasks.stages; rename the stages")
globals().update(STAGE_TASKS)
