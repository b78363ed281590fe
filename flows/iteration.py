"""One closed-loop iteration: the DAG of ARCHITECTURE.md as Prefect tasks, one per stage.

The flow holds the workspace lock throughout (closedloop.runlock) and continues an iteration a run
left unfinished (closedloop.progress): a stage whose outputs DVC already recorded for this
iteration is not run again, and the version step finishes only what is missing.
"""

from __future__ import annotations

import time
from typing import Optional

from prefect import flow
from prefect.artifacts import create_table_artifact

from closedloop.config import Params, load_params
from closedloop.io import say
from closedloop.lineage.record import benchmark_rows
from closedloop.pipeline import ITERATION_STAGES
from closedloop.runlock import workspace_lock
from closedloop.workspace import Workspace
from flows.hooks import flow_run_id, flow_run_ids, on_interrupted
from tasks import lineage, stages


@flow(name="closedloop-iteration", log_prints=True, on_cancellation=[on_interrupted], on_crashed=[on_interrupted])
def iteration_flow(params: Optional[Params] = None, workspace: str = ".", progress: bool = False) -> dict:
    """Sample the champion on fresh tasks, score, grade, validate, train a candidate, gate, promote."""
    with workspace_lock(workspace, wait=True, command="closedloop-iteration flow", flow_run_id=flow_run_id()):
        lineage.recover_git_state(workspace)  # before anything reads params.yaml
        return _iteration(params, workspace, progress)


def _iteration(params: Optional[Params], workspace: str, progress: bool) -> dict:
    started = time.perf_counter()
    previous = load_params(workspace)
    params, record = lineage.begin_iteration(workspace, params or previous, previous, flow_run_ids())
    resuming = record.attempts > 1
    timing = {"task": {}, "work": {}, "recorded": {}, "skipped": []}
    current = "preflight"
    try:
        # The champion this iteration reads (the one it began with, when resumed), which preflight checks.
        lineage.close_loop(workspace, record.champion if resuming else None)
        lineage.preflight(workspace, params)  # a missing or corrupt input fails here, before any work
        for current in ITERATION_STAGES:  # validate stops a failing batch here, before training
            if resuming and lineage.stage_done(workspace, current):
                say(f"closedloop: resume: stage {current} already done for iteration {params.loop.iteration} "
                    "(its outputs match dvc.lock); not run again")
                timing["skipped"].append(current)
                continue
            step_started = time.perf_counter()
            lineage.note_stage(workspace, current, done=False)
            metrics = stages.STAGE_TASKS[current](workspace, params, progress)
            lineage.note_stage(workspace, current, done=True)
            timing["task"][current] = time.perf_counter() - step_started
            timing["work"][current] = metrics["seconds"]
            timing["recorded"][current] = metrics["recorded_seconds"]
    except Exception as error:
        from closedloop.stages.validate import BatchValidationError

        lineage.record_failure(workspace, params, current, str(error), final=isinstance(error, BatchValidationError))
        raise
    version_started = time.perf_counter()
    try:
        lineage.push(workspace, params)
        summary = lineage.version(workspace, params, timing["task"])
    except Exception as error:
        lineage.record_failure(workspace, params, "version", str(error))
        raise
    timing["version_seconds"] = time.perf_counter() - version_started
    create_table_artifact(
        key=f"benchmark-iteration-{params.loop.iteration}",
        table=benchmark_rows(Workspace.at(workspace)),
        description=f"Benchmark pass@1, champion vs candidate, iteration {params.loop.iteration}: "
        + ("promoted" if summary["promoted"] else "held")
        + (f" (not trained: {summary['not_trained']})" if summary.get("not_trained") else ""),
    )
    lineage.finish_iteration(workspace)
    timing["total_seconds"] = time.perf_counter() - started
    return {**summary, "resumed": resuming, "timing": timing}
