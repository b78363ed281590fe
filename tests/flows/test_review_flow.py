"""The review flow under a real Prefect API: paused with its form, answered through the API as the UI
does (resume_flow_run with run_input), refused input naming the field, and a timeout."""

import json
import threading
import time

import pytest

from closedloop.io import write_jsonl
from closedloop.review import labels
from closedloop.workspace import Workspace
from tests.unit.test_review import batch, strata

pytestmark = pytest.mark.usefixtures("prefect_api")


@pytest.fixture
def reviewed(tmp_path):
    from closedloop.review.sample import draw

    ws = Workspace.at(tmp_path)
    rows = draw(*batch(), strata(), size=4, seed=1, iteration=5)
    write_jsonl(ws.review_sample, rows)
    return ws, rows


def start(ws, **kwargs):
    """The flow in a thread; returns (thread, result holder, the paused flow run)."""
    from prefect import get_client

    from flows.review import review_flow

    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", review_flow(workspace=str(ws.root), **kwargs)))
    started = time.monotonic()
    thread.start()
    with get_client(sync_client=True) as client:
        while time.monotonic() - started < 60:
            paused = [run for run in client.read_flow_runs()
                      if run.state and run.state.is_paused() and run.parameters.get("workspace") == str(ws.root)]
            if paused:
                return thread, result, paused[0]
            time.sleep(0.2)
    raise AssertionError("the review flow never paused")


def test_answered_through_the_api_queues_the_answers(reviewed):
    from prefect.flow_runs import resume_flow_run
    from prefect.input.actions import read_flow_run_input

    ws, rows = reviewed
    thread, result, run = start(ws, timeout_s=60, poll_interval_s=1)
    keys = run.state.state_details.run_input_keyset
    schema = read_flow_run_input(keys["schema"], flow_run_id=run.id)
    assert set(schema["properties"]) == {"reviewer", *(row["sample_id"] for row in rows)}
    description = read_flow_run_input(keys["description"], flow_run_id=run.id)
    assert rows[0]["prompt"] in description and rows[0]["completion"] in description

    first, second = rows[0]["sample_id"], rows[1]["sample_id"]
    for bad, field in (({"reviewer": "ann", first: {"score": 1.5, "label": "correct"}}, f"$['{first}'].score"),
                       ({"reviewer": "ann", "code/train/nope#0": {"score": 1, "label": "correct"}}, "nope#0"),
                       ({"reviewer": "", first: {"score": 1, "label": "correct"}}, "reviewer")):
        with pytest.raises(RuntimeError, match="Validation failed") as error:
            resume_flow_run(run.id, run_input=bad)
        assert field in str(error.value)
    assert not labels.inbox_path(ws).exists()  # refused input left the run paused and wrote nothing

    resume_flow_run(run.id, run_input={"reviewer": "ann", first: {"score": 1, "label": "correct"},
                                       second: {"score": 0, "label": "reward_hacking", "comment": "prints the answer"}})
    thread.join(60)
    assert result["value"]["state"] == "answered"
    assert (result["value"]["answers"], result["value"]["reviewers"]) == (2, ["ann"])
    inbox = [json.loads(line) for line in labels.inbox_path(ws).read_text().splitlines()]
    assert [(r["sample_id"], r["reviewer"], r["label"]) for r in inbox] == \
        [(first, "ann", "correct"), (second, "ann", "reward_hacking")]
    assert inbox[0]["source"] == f"prefect-ui:{run.id}"


def test_an_empty_answer_is_asked_again_and_then_times_out(reviewed):
    from prefect import get_client
    from prefect.artifacts import Artifact
    from prefect.flow_runs import resume_flow_run

    ws, rows = reviewed
    thread, result, run = start(ws, timeout_s=6, poll_interval_s=1)
    resume_flow_run(run.id, run_input={"reviewer": "ann"})  # valid for the schema, but no sample scored
    thread.join(60)
    assert result["value"] == {"state": "timed_out", "answers": 0, "reviewers": [], "samples": len(rows),
                               "iteration": 5}
    assert not labels.inbox_path(ws).exists() or labels.inbox_path(ws).read_text() == ""
    with get_client(sync_client=True) as client:
        final = client.read_flow_run(run.id).state
    assert final.is_completed(), final  # a review nobody answered is an outcome, not a failed run
    artifact = Artifact.get("review-iteration-5")
    assert "No human scores came" in artifact.data


def test_no_review_sample_ends_at_once(tmp_path):
    from flows.review import review_flow

    write_jsonl(Workspace.at(tmp_path).review_sample, [])
    assert review_flow(workspace=str(tmp_path), timeout_s=60)["state"] == "empty"
