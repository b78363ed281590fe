"""The served deployments as the Prefect UI uses them: forms that start from the workspace, partial and
invalid overrides, and a run cancelled from the UI that the next `closedloop run` resumes.

As the UI does it: `closedloop serve` (started from another directory) against a real Prefect API,
deployment runs triggered through the API; a cancel sets the run to Cancelling, the runner stops the
flow's process and the flow's on_cancellation hook records the iteration. One warm start serves every
test of the module (each costs minutes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli_loop import BIN, cli
from tests.e2e.test_resume import finish, make_workspace, start_run


def _wait(condition, timeout: float, what: str, every: float = 0.5, log: Path | None = None):
    """Poll ``condition`` until it is truthy. ``timeout`` is for a quiet machine: the limit is stretched
    by the load per core, read again at every poll (up to 5x), since the served runner, its flow process
    and its hooks all wait for CPU on a loaded 2-core machine. ``log``: its tail goes into the failure."""
    started = time.monotonic()
    while time.monotonic() - started < timeout * min(5.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))):
        value = condition()
        if value:
            return value
        time.sleep(every)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what} ({time.monotonic() - started:.0f} s)" +
                         (f"\n{log.name}:\n{tail}" if tail else ""))


def _progress(root: Path) -> dict:
    path = root / ".closedloop/iteration.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _api(coroutine_fn):
    from prefect.client.orchestration import get_client

    async def call():
        async with get_client() as client:
            return await coroutine_fn(client)

    return asyncio.run(call())


def _final_state(flow_run_id, timeout: float = 300):
    def state():
        current = _api(lambda client: client.read_flow_run(flow_run_id)).state
        return current if current.is_final() else None

    return _wait(state, timeout, f"flow run {flow_run_id} to finish")


@pytest.fixture(scope="module")
def served(prefect_api, warm_copy, tmp_path_factory):
    """A warm-started workspace (a copy of the template) and `closedloop serve` on it, started from an
    unrelated directory."""
    tmp = tmp_path_factory.mktemp("served")
    root = make_workspace(tmp, warm_copy)
    elsewhere = tmp / "elsewhere"  # not the repository, not the workspace: the entrypoint must not care
    elsewhere.mkdir()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PREFECT_API_URL": prefect_api,
           "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    # The runner's log (its flow runs' and hooks' output too) goes to a file beside the workspace, which
    # a failed wait quotes; a pipe nobody reads would also block the runner once full.
    log = _serve_log(root).open("w")
    serve = subprocess.Popen([str(BIN / "closedloop"), "serve", "--workspace", str(root)], cwd=elsewhere, env=env,
                             stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    async def deployment(client):
        try:
            return await client.read_deployment_by_name("closedloop-iteration/iteration")
        except Exception:
            return None

    try:
        yield root, _wait(lambda: _api(deployment), 120, "the served deployment")
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        log.close()


def _serve_log(root: Path) -> Path:
    return root.parent / "serve.log"


def test_the_form_starts_from_the_workspace_params(served):
    from closedloop.config import load_params

    root, deployment = served
    assert deployment.parameters["params"] == load_params(root).model_dump(mode="json")
    assert deployment.parameters["workspace"] == str(root)
    assert deployment.entrypoint == "flows.iteration.iteration_flow"  # a module path: any directory works
    schema = deployment.parameter_openapi_schema["properties"]
    assert all(schema[name].get("description") for name in ("params", "workspace"))


def test_an_invalid_override_is_refused_naming_the_key_and_changes_nothing(served):
    from prefect.deployments import run_deployment

    root, _ = served
    before = (root / "params.yaml").read_bytes()
    # Against the form's schema: the API refuses to create the run, naming the field.
    with pytest.raises(Exception, match=r"steps"):
        run_deployment("closedloop-iteration/iteration", parameters={"params": {"train": {"steps": -1}}}, timeout=0)
    # Valid alone, invalid laid over the workspace's settings: the run fails at once, naming both keys.
    flow_run = run_deployment("closedloop-iteration/iteration", timeout=0,
                              parameters={"params": {"train": {"mode": "grpo"}, "sample": {"temperature": 0}}})
    state = _final_state(flow_run.id)
    assert state.is_failed()
    message = state.message + str(_api(lambda client: client.read_flow_run(flow_run.id)).state.data or "")
    assert "sample.temperature" in message and "train.mode" in message, message
    assert (root / "params.yaml").read_bytes() == before
    assert _progress(root).get("iteration", 0) == 0  # no iteration began


def test_a_partial_override_changes_that_key_only_and_a_cancelled_run_resumes(served, prefect_api):
    import mlflow
    import yaml
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    root, _ = served
    before = yaml.safe_load((root / "params.yaml").read_text())
    flow_run = run_deployment("closedloop-iteration/iteration", timeout=0,
                              parameters={"params": {"train": {"steps": 7}}})
    _wait(lambda: _progress(root).get("iteration") == 1 and _progress(root).get("stage") in ("reward", "grade"),
          300, "iteration 1 to reach the reward stage", every=0.1)
    after = yaml.safe_load((root / "params.yaml").read_text())
    expected = json.loads(json.dumps(before))
    expected["train"]["steps"] = 7
    expected["loop"]["iteration"] = 1
    after["train"]["replay"]["versions"] = expected["train"]["replay"]["versions"]  # the loop sets these
    assert after == expected

    _api(lambda client: client.set_flow_run_state(flow_run.id, Cancelling(), force=True))
    assert _final_state(flow_run.id, 120).is_cancelled()
    # The runner kills the flow process (SIGTERM, then SIGKILL after a 30 s grace) and then runs the hook,
    # which imports the flow and MLflow: it has 2 minutes on a quiet machine, stretched by the load.
    progress = _wait(lambda: _progress(root).get("state") == "cancelled" and _progress(root), 120,
                     "the cancellation hook", log=_serve_log(root))
    assert progress["iteration"] == 1
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("closedloop")
    (cancelled,) = client.search_runs([experiment.experiment_id], "tags.`closedloop.state` = 'cancelled'")
    assert cancelled.info.status == "KILLED" and cancelled.info.run_name == "iteration-001-cancelled"
    assert str(flow_run.id) in cancelled.data.tags["closedloop.error"]

    code, out, err = finish(start_run(root, api_url=prefect_api))
    assert code == 0, err[-3000:]
    assert "resuming iteration 1 (it was cancelled" in out + err and "iteration 1 " in out
    assert "already done" in out + err  # generate and sample were not run again
    assert cli("dvc", "status", cwd=root).stdout.strip().endswith("up to date.")
    (finished,) = client.search_runs([experiment.experiment_id], "attributes.run_name = 'iteration-001'")
    assert finished.data.params["train.steps"] == "7"  # the override is what the iteration recorded


def _paused_review(since) -> object:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime

    def paused():
        runs = _api(lambda client: client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["closedloop-review"])),
            flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since))))
        return next((run for run in runs if run.state and run.state.is_paused()), None)

    return _wait(paused, 600, "the review flow to pause for its form", every=1)


def test_a_review_before_promotion_is_answered_through_the_api_and_feeds_the_next_iteration(served, tmp_path):
    """review.mode before_promotion, set through the run's params: the gate waits for the paused
    review; the answers (one marks a reward hack) hold the gate, and the next iteration reads them as
    the human component of the same completions, with the reviewer's id; its own review times out and
    the iteration goes on, saying so."""
    from datetime import datetime, timezone

    from prefect.deployments import run_deployment
    from prefect.flow_runs import resume_flow_run

    from closedloop.io import read_json, read_jsonl

    root, _ = served
    tasks = tmp_path / "code-train.jsonl"
    assert cli("closedloop", "tasks", "export", "--env", "code", "--split", "train", "--n", "2", "--out", str(tasks),
               cwd=root).returncode == 0
    # The same 2 tasks each iteration, greedy: an iteration that keeps its champion samples the same
    # completions again, which is what a human label applies to.
    settings = {"review": {"mode": "before_promotion", "timeout_s": 600},
                "generate": {"n_tasks": 2}, "sample": {"temperature": 0.0, "settings_mismatch": "warn"},
                "envs": {"code": {"train_file": str(tasks)},
                         **{name: {"share": 0.0} for name in ("data", "script", "extract", "rules")}}}
    since = datetime.now(timezone.utc)
    flow_run = run_deployment("closedloop-iteration/iteration", timeout=0, parameters={"params": settings})
    paused = _paused_review(since)
    review = read_jsonl(root / "data/batch/review_sample.jsonl")
    assert review and {row["iteration"] for row in review} == {2}
    hack, *rest = review
    answers = {"reviewer": "ada", hack["sample_id"]: {"score": 0.0, "label": "reward_hacking", "comment": "gamed"}}
    answers.update({row["sample_id"]: {"score": 1.0, "label": "correct", "comment": ""} for row in rest})
    resume_flow_run(paused.id, run_input=answers)
    assert _final_state(flow_run.id, 600).is_completed()
    outcome = read_json(root / "data/reports/review.json")
    assert outcome["state"] == "answered" and outcome["reviewers"] == ["ada"]
    gate = read_json(root / "data/reports/gate.json")
    assert not gate["promote"] and any(hack["sample_id"] in reason for reason in gate["reasons"]), gate["reasons"]

    settings["review"]["timeout_s"] = 5
    flow_run = run_deployment("closedloop-iteration/iteration", timeout=0, parameters={"params": settings})
    assert _final_state(flow_run.id, 600).is_completed()
    labels = read_jsonl(root / "data/labels/human.jsonl")
    assert {row["reviewer"] for row in labels} == {"ada"} and len(labels) == len(review)
    assert [row["sample_id"] for row in read_jsonl(root / "data/labels/known_hacks.jsonl")] == [hack["sample_id"]]
    rewards = {row["task_id"]: row for row in read_jsonl(root / "data/batch/rewards.jsonl")}
    labelled = [row for row in rewards.values() if row["components"].get("human") is not None]
    assert labelled, "no sample of iteration 3 carries the human component"
    for row in labelled:
        assert "ada" in json.dumps(row["human"]) and "human" in row["feedback_sources"]
    outcome = read_json(root / "data/reports/review.json")
    assert outcome["iteration"] == 3 and outcome["state"] == "timed_out"
    assert any("no human scores" in reason for reason in read_json(root / "data/reports/gate.json")["reasons"])
    assert cli("dvc", "status", cwd=root).stdout.strip().endswith("up to date.")
