"""An iteration that stopped (a refused batch, a stage that raised, a run cancelled or crashed): logged
to MLflow and marked in the progress record, registering nothing."""

from __future__ import annotations

from closedloop.config import Params
from closedloop.io import say
from closedloop.lineage.mlflow_layout import run_key
from closedloop.lineage.preflight import check_store
from closedloop.progress import update_progress
from closedloop.versioning.store import open_store
from closedloop.workspace import Workspace


def record_failure(ws: Workspace, params: Params, stage: str, error: BaseException | str,
                   state: str = "failed", final: bool = False, iteration: int | None = None) -> str:
    """Log an iteration that stopped (a batch that failed validation, a stage that raised, a run
    cancelled or crashed) and mark it so in the progress record; registers nothing. Never raises:
    the error being recorded is the one that matters.

    ``state`` is ``failed`` (run status FAILED) or ``cancelled`` / ``crashed`` (KILLED). The next
    ``closedloop run`` resumes it, unless it is ``final`` (validation refused the batch)."""

    update_progress(ws.root, state=state, stage=stage, reason=str(error)[:4000], final=final)
    iteration = params.loop.iteration if iteration is None else iteration
    try:
        # an unreachable server would cost MLflow's retries (minutes) before this fails anyway
        check_store(ws.root, params.tracking.uri, timeout_s=5.0)
        tracking = open_store(ws, params)
        artifacts = [p for p in (ws.validation_report, ws.validation_dir / "docs") if stage == "validate" and p.exists()]
        return tracking.log_iteration(
            iteration=iteration, run_name=f"iteration-{iteration:03d}-{state}",
            params=params.model_dump(mode="json"), metrics={},
            tags={**run_key(ws.root, iteration, "iteration"), "closedloop.state": state,
                  "closedloop.failed_stage": stage, "closedloop.error": str(error)[:4000]},
            rewards=[], datasets=[], artifacts=artifacts, stage_seconds={},
            status="FAILED" if state == "failed" else "KILLED",
        )
    except Exception as failure:  # noqa: BLE001
        say(f"closedloop: warning: could not record the {state} iteration {iteration} in MLflow: {failure}")
        return ""
