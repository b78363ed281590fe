"""A run cancelled from the Prefect UI is recorded, and the next `closedloop run` resumes it.

As the UI does it: `closedloop serve` against a real Prefect API, a deployment run triggered through
the API, then set to Cancelling; the runner stops the flow's process and the flow's
on_cancellation hook records the iteration."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

from tests.e2e.test_cli_loop import BIN, cli
from tests.e2e.test_resume import finish, make_workspace, start_run

REPO = Path(__file__).resolve().parents[2]


def _wait(condition, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _progress(root: Path) -> dict:
    path = root / ".closedloop/iteration.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_a_cancelled_deployment_run_is_recorded_and_resumed(prefect_api, tmp_path):
    import mlflow
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Cancelling

    root = make_workspace(tmp_path)
    code, _, err = finish(start_run(root, "-n", "0"))  # the warm start only
    assert code == 0, err[-3000:]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PREFECT_API_URL": PREFECT_API_URL.value(),
           "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    serve = subprocess.Popen([str(BIN / "closedloop"), "serve", "--workspace", str(root)], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        async def deployment_ready():
            async with get_client() as client:
                try:
                    return await client.read_deployment_by_name("closedloop-iteration/iteration")
                except Exception:
                    return None

        _wait(lambda: asyncio.run(deployment_ready()), 120, "the served deployment")
        flow_run = run_deployment("closedloop-iteration/iteration", timeout=0)
        _wait(lambda: _progress(root).get("iteration") == 1 and _progress(root).get("stage") in ("reward", "grade"),
              300, "iteration 1 to reach the reward stage", every=0.1)

        async def cancel():
            async with get_client() as client:
                await client.set_flow_run_state(flow_run.id, Cancelling(), force=True)

        asyncio.run(cancel())

        async def state():
            async with get_client() as client:
                return (await client.read_flow_run(flow_run.id)).state

        final = _wait(lambda: (s := asyncio.run(state())).is_cancelled() and s, 120, "the run to be cancelled")
        assert final.is_cancelled()
        progress = _wait(lambda: _progress(root).get("state") == "cancelled" and _progress(root), 60,
                         "the cancellation hook")
        assert progress["iteration"] == 1
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("closedloop")
    (cancelled,) = client.search_runs([experiment.experiment_id], "tags.`closedloop.state` = 'cancelled'")
    assert cancelled.info.status == "KILLED" and cancelled.info.run_name == "iteration-001-cancelled"
    assert str(flow_run.id) in cancelled.data.tags["closedloop.error"]

    code, out, err = finish(start_run(root))
    assert code == 0, err[-3000:]
    assert "resuming iteration 1 (it was cancelled" in out + err and "iteration 1 " in out
    assert "already done" in out + err  # generate and sample were not run again
    assert cli("dvc", "status", cwd=root).stdout.strip().endswith("up to date.")
