"""The grade stage's review sample on a real batch, `closedloop review`, and the inbox kept out of git
after `dvc add` of the labels."""

import json
import subprocess

import pytest

from closedloop.cli import main
from closedloop.io import read_jsonl, write_jsonl
from closedloop.review import labels
from closedloop.envs.base import load_tasks
from closedloop.stages.common import run_stage
from closedloop.workspace import Workspace
from tests.conftest import tiny_params


@pytest.fixture
def graded(workspace):
    """generate → samples (each task's reference, then half of it) → reward: a real batch without a model."""
    ws = Workspace.at(workspace)
    run_stage("generate", workspace)
    rows = [{"sample_id": f"{t.task_id}#{i}", "task_id": t.task_id, "env": t.env, "slice": t.slice, "kind": "train",
             "sample_index": i, "completion": t.reference if i == 0 else t.reference[: len(t.reference) // 2],
             "model_version": "f" * 16, "prompt_tokens": 1, "completion_tokens": 1, "finish_reason": "stop"}
            for t in load_tasks(ws.tasks) for i in range(2)]
    write_jsonl(ws.samples, rows)
    run_stage("reward", workspace)
    return ws


def test_grade_writes_the_review_sample(graded):
    metrics = run_stage("grade", graded.root)
    rows = read_jsonl(graded.review_sample)
    params = tiny_params()
    assert 0 < len(rows) <= params.review.size and sum(metrics["review_sample"].values()) == len(rows)
    assert len({r["sample_id"] for r in rows}) == len(rows)
    assert {r["env"] for r in rows} == {"code", "data", "script", "extract", "rules"}
    first = rows[0]
    assert set(first["verifier"]) == {"passed", "reward", "status", "components", "steps", "feedback"}
    assert first["model_version"] == "f" * 16 and first["task"]["task_id"] == first["task_id"]
    before = graded.review_sample.read_bytes()
    run_stage("grade", graded.root)
    assert graded.review_sample.read_bytes() == before  # deterministic


def test_review_off_writes_an_empty_sample(graded):
    params = tiny_params(review={"mode": "off"})
    run_stage("grade", graded.root, params)
    assert graded.review_sample.read_text() == ""


def test_cli_queues_answers_or_names_the_field(graded, capsys, tmp_path):
    run_stage("grade", graded.root)
    rows = read_jsonl(graded.review_sample)
    w = str(graded.root)
    assert main(["review", "-w", w, "--list"]) == 0
    assert rows[0]["sample_id"] in capsys.readouterr().out

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"sample_id": rows[0]["sample_id"], "score": 1, "label": "correct", "reviewer": "ann"})
                   + "\n" + json.dumps({"sample_id": "nope", "score": 1, "label": "correct", "reviewer": "ann"}) + "\n")
    assert main(["review", "-w", w, "--answers", str(bad)]) == 2
    assert "answers[1].sample_id: 'nope' is not in the review sample" in capsys.readouterr().err
    assert main(["review", "-w", w, "--sample-id", rows[0]["sample_id"], "--score", "1.2", "--label", "correct",
                 "--reviewer", "ann"]) == 2
    assert f"answers[0].score (sample {rows[0]['sample_id']})" in capsys.readouterr().err
    assert not labels.inbox_path(graded).exists()  # all or nothing

    assert main(["review", "-w", w, "--sample-id", rows[0]["sample_id"], "--score", "0", "--label",
                 "reward_hacking", "--reviewer", "ann", "--comment", "hard-codes the output"]) == 0
    assert "queued 1 answer(s) for the next iteration" in capsys.readouterr().out

    # merge, then `dvc add` as close_loop does: the inbox stays out of git, DVC's own entries beside it
    from closedloop.lineage.dvc import DvcWorkspace
    from closedloop.workspace import HUMAN_LABELS, KNOWN_HACKS

    assert labels.merge_inbox(graded)["known_hacks"] == 1
    DvcWorkspace(graded.root).add(HUMAN_LABELS, KNOWN_HACKS)
    ignored = (graded.root / "data/labels/.gitignore").read_text().splitlines()
    assert {"/inbox.jsonl", "/human.jsonl", "/known_hacks.jsonl"} <= set(ignored)
    labels.submit(graded, {"reviewer": "bo", "answers": [{"sample_id": rows[1]["sample_id"], "score": 1,
                                                          "label": "correct"}]}, rows, "api")
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "data/labels"],
                            cwd=graded.root, capture_output=True, text=True, check=True).stdout
    assert "inbox" not in status
