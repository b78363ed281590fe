"""Prefect state hooks: a run cancelled from the UI or crashed is recorded, and left resumable."""

from __future__ import annotations

from closedloop.io import say


def flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id or None


def on_interrupted(flow, flow_run, state) -> None:
    """on_cancellation / on_crashed: record the iteration in MLflow as KILLED with the state and its
    message, and mark the progress record, so the next `closedloop run` continues the iteration.

    Nothing here may raise: a hook that fails hides the state it reports."""
    from closedloop.config import load_params
    from closedloop.lineage.record import record_failure
    from closedloop.progress import read_progress
    from closedloop.workspace import Workspace

    try:
        ws = Workspace.at(flow_run.parameters.get("workspace", "."))
        progress = read_progress(ws.root)
        if progress is None or progress.state == "done":
            return  # interrupted before an iteration began, or after it was recorded
        params = load_params(ws.root)
        kind = "cancelled" if state.is_cancelled() or state.is_cancelling() else "crashed"
        reason = f"Prefect flow run {flow_run.id} {kind}: {state.message or state.name}"
        record_failure(ws, params, progress.stage or "(between stages)", reason, state=kind)
        say(f"closedloop: iteration {progress.iteration} {kind}; `closedloop run` resumes it")
    except Exception as error:  # noqa: BLE001
        say(f"closedloop: warning: could not record the interrupted run: {error}")
