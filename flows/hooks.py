"""Prefect state hooks: a run cancelled from the UI or crashed is recorded, and left resumable."""

from __future__ import annotations

from closedloop.io import say


def flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id or None


def flow_run_ids() -> list[str]:
    """This flow run and the run at the root of its tree (a cancelled parent cancels its subflows)."""
    from prefect.runtime import flow_run

    return [str(i) for i in dict.fromkeys((flow_run.id, flow_run.root_flow_run_id)) if i]


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
        if progress is None or progress.state == "done" or str(flow_run.id) not in progress.flow_run_ids:
            # not begun, already recorded, or another run's iteration (this one was still waiting
            # for the workspace lock when it was cancelled)
            return
        params = load_params(ws.root)
        kind = "cancelled" if state.is_cancelled() or state.is_cancelling() else "crashed"
        reason = f"Prefect flow run {flow_run.id} {kind}: {state.message or state.name}"
        record_failure(ws, params, progress.stage or "(between stages)", reason, state=kind,
                       iteration=progress.iteration)
        say(f"closedloop: iteration {progress.iteration} {kind}; `closedloop run` resumes it")
    except Exception as error:  # noqa: BLE001
        say(f"closedloop: warning: could not record the interrupted run: {error}")
