"""One closed-loop iteration: the DAG of ARCHITECTURE.md as Prefect tasks, one per stage.

The flow holds the workspace lock throughout (closedloop.runlock) and continues an iteration a run
left unfinished (closedloop.progress): a stage whose outputs DVC already recorded for this
iteration is not run again, and the version step finishes only what is missing.
"""

from __future__ import annotations

import time
from typing import Optional

from prefect import flow

from closedloop.config import Params, load_params
from closedloop.io import read_json, say
from closedloop.pipeline import ITERATION_STAGES, iteration_steps
from closedloop.reports.gate_report import gate_markdown, monitors_markdown
from closedloop.runlock import workspace_lock
from closedloop.stages.validate import BatchValidationError
from closedloop.workspace import Workspace
from flows.hooks import flow_run_id, flow_run_ids, hold_if_cancelled, on_interrupted
from flows.params import workspace_params
from flows.ray_runner import stage_runner
from flows.review import review_for_iteration
from tasks import lineage


@flow(name="closedloop-iteration", log_prints=True, on_cancellation=[on_interrupted], on_crashed=[on_interrupted])
def iteration_flow(params: Optional[Params] = None, workspace: str = ".", progress: bool = False) -> dict:
    """Sample the champion on fresh tasks, score, grade, validate, train a candidate, gate, promote.

    Args:
        params: Settings for this run, laid over the workspace's params.yaml: only what you change
            here overrides the file (a partial {"train": {"steps": 12}} is fine), and the result is
            validated and written to params.yaml before the first stage.
        workspace: The closedloop workspace (a directory made by `closedloop init`).
        progress: Show progress bars in the logs.
    """
    with workspace_lock(workspace, wait=True, command="closedloop-iteration flow", flow_run_id=flow_run_id()):
        lineage.recover_git_state(workspace)  # before anything reads params.yaml
        return _iteration(params, workspace, progress)


def _review_before_promotion(workspace: str, params: Params, timing: dict) -> None:
    """review.mode before_promotion: the gate waits for people to review this batch's review sample
    (the review flow, paused with its form, for review.timeout_s at most); what they said is the
    gate's input. A resumed iteration whose review already came back does not ask again."""
    if lineage.review_settled(workspace, params.loop.iteration):
        say(f"closedloop: resume: the review of iteration {params.loop.iteration} already came back; not asked again")
        return
    started = time.perf_counter()
    lineage.note_stage(workspace, "review", done=False)  # not a DVC stage: its record is review.json
    outcome = lineage.record_review(workspace, params, review_for_iteration(workspace, params))
    timing["task"]["review"] = time.perf_counter() - started
    if outcome["state"] == "answered":
        say(f"closedloop: review: {len(outcome['answers'])} answer(s) from {', '.join(outcome['reviewers'])} "
            "before the gate")
    else:
        say(f"closedloop: review: no human scores came ({outcome['state']}); the gate decides without them")


# What runs each of pipeline.FLOW_STEPS in this flow.
FLOW_STEP_RUNNERS = {"review": _review_before_promotion}


def _iteration(params: Optional[Params], workspace: str, progress: bool) -> dict:
    started = time.perf_counter()
    previous = load_params(workspace)
    params = workspace_params(workspace, params)  # a bad override fails here, before anything is written
    params, record = lineage.begin_iteration(workspace, params, previous, flow_run_ids())
    resuming = record.attempts > 1
    timing = {"task": {}, "work": {}, "recorded": {}, "skipped": []}
    current = "preflight"
    try:
        # The champion this iteration reads (the one it began with, when resumed), which preflight checks.
        lineage.merge_reviews(workspace, params, resuming)  # answers queued since the last iteration: its labels
        lineage.close_loop(workspace, record.champion if resuming else None)
        lineage.preflight(workspace, params)  # a missing or corrupt input fails here, before any work
        current = ITERATION_STAGES[0]  # a Ray cluster that cannot be reached: the first stage cannot start
        # execution.backend local: each stage task called here, in the flow process; ray: submitted to
        # prefect-ray's RayTaskRunner (flows/ray_runner.py) and waited for, one stage at a time.
        with stage_runner(params) as run_stage:
            for current in iteration_steps(params):  # validate stops a failing batch here, before training
                if current in FLOW_STEP_RUNNERS:  # a step of the flow that is not a DVC stage
                    FLOW_STEP_RUNNERS[current](workspace, params, timing)
                    continue
                if resuming and lineage.stage_done(workspace, current):
                    say(f"closedloop: resume: stage {current} already done for iteration {params.loop.iteration} "
                        "(its outputs match dvc.lock); not run again")
                    timing["skipped"].append(current)
                    continue
                hold_if_cancelled(f"stage {current}")
                step_started = time.perf_counter()
                lineage.note_stage(workspace, current, done=False)
                metrics = run_stage(current, workspace, params, progress)
                lineage.note_stage(workspace, current, done=True)
                timing["task"][current] = time.perf_counter() - step_started
                timing["work"][current] = metrics["seconds"]
                timing["recorded"][current] = metrics["recorded_seconds"]
    except Exception as error:
        lineage.record_failure(workspace, params, current, str(error), final=isinstance(error, BatchValidationError))
        raise
    version_started = time.perf_counter()
    try:
        hold_if_cancelled("the version step")
        lineage.push(workspace, params)
        summary = lineage.version(workspace, params, timing["task"])
    except Exception as error:
        lineage.record_failure(workspace, params, "version", str(error))
        raise
    timing["version_seconds"] = time.perf_counter() - version_started
    from prefect.artifacts import create_markdown_artifact

    ws = Workspace.at(workspace)
    # The gate's decision for people: registry versions, per environment and slice, the MLflow run.
    create_markdown_artifact(
        key=f"gate-iteration-{params.loop.iteration}",
        markdown=gate_markdown(read_json(ws.gate), summary),
        description=summary["decision"],
    )
    # The monitors' verdicts over this batch and the ones before it (keys: lowercase, digits, dashes).
    monitors = read_json(ws.monitors_report)
    create_markdown_artifact(
        key=f"monitors-iteration-{params.loop.iteration}", markdown=monitors_markdown(monitors),
        description=(f"monitors failing: {', '.join(monitors['failing'])}" if monitors["failing"]
                     else "no monitor failed"),
    )
    lineage.finish_iteration(workspace)
    timing["total_seconds"] = time.perf_counter() - started
    return {**summary, "resumed": resuming, "timing": timing}
