"""Prefect state hooks: a run cancelled from the UI or crashed is recorded, and left resumable."""

from __future__ import annotations

import os
import time

from closedloop.config import load_params
from closedloop.io import say
from closedloop.progress import read_progress
from closedloop.versioning.failures import record_failure
from closedloop.workspace import Workspace

# How long a flow that saw its own cancel waits for the runner to stop it, on a quiet machine.
_RUNNER_GRACE_S = 120.0


def flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id or None


def flow_run_ids() -> list[str]:
    """This flow run and the run at the root of its tree (a cancelled parent cancels its subflows)."""
    from prefect.runtime import flow_run

    return [str(i) for i in dict.fromkeys((flow_run.id, flow_run.root_flow_run_id)) if i]


def _own_state():
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run.id).state


def hold_if_cancelled(next_step: str) -> None:
    """A stage boundary: a run cancelled from the UI starts no further stage.

    The runner stops a cancelled flow's process when it notices the cancel, which on a loaded machine
    can be tens of seconds later: by then a short iteration has run its remaining stages and finished,
    and the cancel did nothing. So before each stage the flow reads its own state (one API call); when
    it is Cancelling it waits here for the runner to stop it (the on_cancellation hook then records the
    iteration as resumable). A run nobody stops (no runner serves it) raises after the grace, stretched
    by the load, and is recorded as a failure the next `closedloop run` resumes."""
    try:
        state = _own_state()
    except Exception as error:  # noqa: BLE001 -- an API hiccup must not fail the iteration
        say(f"closedloop: warning: could not read this flow run's state before {next_step}: {error}")
        return
    if state is None or not state.is_cancelling():
        return
    say(f"closedloop: this run was cancelled; {next_step} is not started (waiting for the runner to stop it)")
    started = time.monotonic()
    while time.monotonic() - started < _RUNNER_GRACE_S * min(5.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))):
        time.sleep(1.0)
        try:
            state = _own_state()
        except Exception:  # noqa: BLE001
            continue
        if state is not None and not state.is_cancelling() and not state.is_cancelled():
            say(f"closedloop: the cancel was withdrawn (state {state.name}); going on with {next_step}")
            return
    raise RuntimeError(f"this flow run was cancelled before {next_step} and no runner stopped it; "
                       "`closedloop run` resumes the iteration")


def on_interrupted(flow, flow_run, state) -> None:
    """on_cancellation / on_crashed: record the iteration in MLflow as KILLED with the state and its
    message, and mark the progress record, so the next `closedloop run` continues the iteration.

    Nothing here may raise: a hook that fails hides the state it reports."""

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
