"""A stage that did nothing useful says so and registers nothing new: a grpo iteration whose groups
have no reward spread trains 0 steps, and its candidate (the champion unchanged) is held by the gate,
not registered, and no alias moves."""

from __future__ import annotations


import pytest

from closedloop.config import load_params
from closedloop.io import read_json


@pytest.fixture(scope="module")
def untrained(warm_copy, tmp_path_factory):
    """Warm start (the template's), then one grpo iteration with k = 1: a group of one sample has no spread."""
    from flows.loop import closed_loop

    root = warm_copy(tmp_path_factory.mktemp("untrained") / "ws", {"sample": {"k": 1}, "train": {"mode": "grpo"}})
    return root, closed_loop(iterations=1, workspace=str(root))


def test_the_iteration_says_why_and_registers_nothing(untrained):
    import mlflow

    from closedloop.cli import report_lines
    from closedloop.lineage import tracking

    root, result = untrained
    (it,) = result["iterations"]
    n_tasks = load_params(root).generate.n_tasks
    reason = f"no group had a reward spread ({n_tasks} groups skipped)"
    assert it["not_trained"] == reason and it["model_version"] is None and not it["promoted"]
    assert f"→ not trained: 0 steps ({reason})" in report_lines(result)

    params = load_params(root)
    tracking.configure(root, None, params.tracking.experiment)
    client, name = mlflow.MlflowClient(), params.tracking.registered_model
    assert [str(v.version) for v in client.search_model_versions(f"name='{name}'")] == ["1"]  # the warm start
    assert str(client.get_model_version_by_alias(name, "champion").version) == "1"
    with pytest.raises(Exception):
        client.get_model_version_by_alias(name, "challenger")
    run = client.get_run(it["run_id"])
    assert run.data.tags["closedloop.not_trained"] == reason  # the iteration itself is still logged


def test_the_stage_and_the_gate_record_it(untrained):
    from closedloop.training.candidate_record import TRAINING_FILE
    from closedloop.workspace import Workspace

    root, _ = untrained
    ws = Workspace.at(root)
    from closedloop.stage_files import stage_result

    metrics = stage_result(ws.root, "train")  # untrained_reason is in metrics/info/train.json
    assert metrics["steps"] == 0 and metrics["trained"] is False and "reward spread" in metrics["untrained_reason"]
    assert read_json(ws.candidate / TRAINING_FILE)["trained"] is False
    gate = read_json(ws.gate)
    assert gate["promote"] is False and gate["trained"] is False
    assert gate["reasons"][0].startswith("candidate not trained: 0 steps (no group had a reward spread")


@pytest.mark.parametrize("train, says", [({"mode": "rft", "steps": 0}, "train.steps is 0"),
                                         ({"mode": "sft", "steps": 0}, "train.steps is 0")])
def test_supervised_modes_that_train_nothing_say_so_too(untrained, tmp_path, train, says):
    import shutil

    import yaml

    from closedloop.stages.common import run_stage

    root, _ = untrained
    copy = tmp_path / "ws"
    shutil.copytree(root, copy, symlinks=True)
    data = yaml.safe_load((copy / "params.yaml").read_text())
    data["train"].update(train)
    (copy / "params.yaml").write_text(yaml.safe_dump(data))
    metrics = run_stage("train", copy)
    assert metrics["trained"] is False and metrics["untrained_reason"] == says


def test_the_gate_holds_an_untrained_candidate_whatever_it_scored():
    from closedloop.evaluation.gate import decide

    champion = {"overall": {"pass@1": 0.2, "se": 0.01}, "slices": {}}
    candidate = {"overall": {"pass@1": 0.9, "se": 0.01}, "slices": {}}
    assert decide(champion, candidate, min_improvement=0.0, slice_tolerance=0.05).promote
    held = decide(champion, candidate, min_improvement=0.0, slice_tolerance=0.05, untrained="train.steps is 0")
    assert not held.promote and held.reasons[0] == ("candidate not trained: 0 steps (train.steps is 0); "
                                                    "it is the champion unchanged")
