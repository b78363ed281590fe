"""One Prefect task per DVC stage. Each calls the same stage function as `closedloop stage NAME`."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from closedloop.config import Params
from closedloop.stages.common import run_recorded


def _stage_task(name: str, retries: int = 0):
    def run(workspace: str, params: Params, progress: bool = False) -> dict:
        return run_recorded(name, workspace, params, progress)

    run.__name__ = name
    return task(name=name, retries=retries, persist_result=False, cache_policy=NO_CACHE)(run)


benchmark = _stage_task("benchmark")
warmstart = _stage_task("warmstart")
generate = _stage_task("generate")
sample = _stage_task("sample")
reward = _stage_task("reward")
grade = _stage_task("grade")
validate = _stage_task("validate")
train = _stage_task("train")
evaluate = _stage_task("evaluate")
gate = _stage_task("gate")
promote = _stage_task("promote")
