"""The Prefect flows against a real Prefect API, with real DVC, MLflow and GX underneath."""

from __future__ import annotations

from pathlib import Path

import pytest

from closedloop.config import load_params
from closedloop.lineage.dvc import DvcWorkspace


def _registry(root: Path):
    import mlflow

    from closedloop.lineage import tracking

    params = load_params(root)
    tracking.configure(root, None, params.tracking.experiment)
    return mlflow.MlflowClient(), params.tracking.registered_model


ITERATION_1_TRAIN_SET = "iteration-1-train_set.jsonl"


@pytest.fixture(scope="module")
def looped(prefect_api, tmp_path_factory):
    """A workspace after the warm start and one iteration, run by the loop flow."""
    import shutil

    import yaml

    from closedloop.scaffold import init_workspace
    from closedloop.workspace import TRAIN_SET
    from flows.loop import closed_loop
    from tests.conftest import TINY

    root = tmp_path_factory.mktemp("flow") / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    init_workspace(root)
    result = closed_loop(iterations=1, workspace=str(root))
    # What iteration 1 trained on, kept aside: a later test runs another (failing) iteration in root.
    shutil.copy(root / TRAIN_SET, root.parent / ITERATION_1_TRAIN_SET)
    return root, result


def test_loop_result_names_the_iteration(looped):
    root, result = looped
    assert result["warm_start"]["model_version"] == "1"
    (it,) = result["iterations"]
    assert it["iteration"] == 1 and it["model_version"] == "2"
    assert load_params(root).loop.iteration == 1


def test_dvc_is_clean_after_a_prefect_iteration(looped):
    root, _ = looped
    assert DvcWorkspace(root).status() == {}


def test_iteration_saved_as_experiment_and_pushed(looped):
    root, result = looped
    assert result["iterations"][0]["experiment"] in DvcWorkspace(root).experiments()
    assert any((root / ".dvc-remote").rglob("*")), "nothing was pushed to the local DVC remote"


def test_registry_versions_carry_lineage_tags_and_aliases_follow_the_gate(looped):
    root, result = looped
    client, name = _registry(root)
    tags = client.get_model_version(name, "2").tags
    for key in ("dvc.tasks", "dvc.samples", "dvc.rewards", "dvc.graded", "dvc.train_set", "dvc.model", "git.rev",
                "feedback_sources", "benchmark.pass_at_1", "benchmark.pass_at_1.code/core", "dvc.exp_rev"):
        assert tags.get(key), f"model version 2 lacks tag {key}"
    assert "verifier:code" in tags["feedback_sources"] and "validator:batch" in tags["feedback_sources"]
    lock = (root / "dvc.lock").read_text()
    assert tags["dvc.samples"] in lock
    assert str(client.get_model_version_by_alias(name, "challenger").version) == "2"
    expected_champion = "2" if result["iterations"][0]["promoted"] else "1"
    assert str(client.get_model_version_by_alias(name, "champion").version) == expected_champion


def test_mlflow_run_has_metrics_datasets_and_plot(looped):
    root, result = looped
    client, _ = _registry(root)
    run = client.get_run(result["iterations"][0]["run_id"])
    metrics = run.data.metrics
    for key in ("grade.reward_mean", "grade.reward_std", "grade.pass_rate.code", "grade.buckets.positive",
                "sample.tokens_per_s", "sample.samples_per_s", "stage_seconds.train",
                "evaluate.candidate_pass_at_1"):
        assert key in metrics, f"run lacks metric {key}"
    # Pass rate per environment and per slice, and each environment's reward components.
    for env in ("code", "data", "script", "extract", "rules"):
        for key in (f"evaluate.candidate_pass_at_1/{env}", f"evaluate.candidate_pass_at_1/{env}/core",
                    f"evaluate.candidate_pass_at_1/{env}/edge", f"evaluate.candidate_pass_at_1/{env}/failure_modes",
                    f"reward.per_env.{env}.pass_rate", f"grade.pass_rate.{env}"):
            assert key in metrics, f"run lacks metric {key}"
    assert "reward.per_env.data.components.values" in metrics and "reward.per_env.rules.components.decision" in metrics
    digests = {d.dataset.name: d.dataset.digest for d in run.inputs.dataset_inputs}
    assert {"tasks", "samples", "rewards", "graded"} <= set(digests)
    assert digests["samples"] and digests["samples"] in (root / "dvc.lock").read_text()
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
    assert "plots/reward_hist.png" in artifacts


def test_benchmark_table_artifact_published(looped):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import asyncio

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["benchmark-iteration-1"])))

    artifacts = asyncio.run(read())
    assert artifacts and artifacts[0].type == "table"


def test_failing_batch_stops_before_training_and_moves_nothing(looped, monkeypatch):
    """A grading bug that writes a reward of 1.5: validation stops the iteration before training."""
    import closedloop.stages.grade as grade
    from flows.iteration import iteration_flow

    root, _ = looped
    client, name = _registry(root)
    versions_before = sorted(str(v.version) for v in client.search_model_versions(f"name='{name}'"))
    aliases_before = {a: str(client.get_model_version_by_alias(name, a).version) for a in ("champion", "challenger")}
    candidate = root / "data/models/candidate"
    candidate_mtime = candidate.stat().st_mtime_ns

    original = grade.graded_row

    def corrupt(sample, reward):
        row = original(sample, reward)
        return {**row, "reward": 1.5} if sample["sample_index"] == 0 else row

    monkeypatch.setattr(grade, "graded_row", corrupt)
    with pytest.raises(Exception) as error:
        iteration_flow(workspace=str(root))
    assert "expect_column_values_to_be_between" in str(error.value) and "reward" in str(error.value)
    assert candidate.stat().st_mtime_ns == candidate_mtime  # training never ran
    assert sorted(str(v.version) for v in client.search_model_versions(f"name='{name}'")) == versions_before
    assert {a: str(client.get_model_version_by_alias(name, a).version) for a in aliases_before} == aliases_before
    failed = client.search_runs([client.get_experiment_by_name("closedloop").experiment_id],
                                "tags.`closedloop.failed_stage` = 'validate'")
    assert failed and failed[0].info.status == "FAILED"
    assert (root / "data/batch/validation/report.json").exists()


def test_deployments_expose_params_as_a_form(prefect_api, tmp_path):
    """What the Prefect UI renders: the applied deployment's schema has a field per setting."""
    import asyncio

    from prefect.client.orchestration import get_client

    import yaml

    from flows.serve import deployments
    from tests.conftest import TINY

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY))
    deployment = {d.name: d for d in deployments(str(tmp_path))}["iteration"]
    deployment_id = deployment.apply()

    async def read():
        async with get_client() as client:
            return await client.read_deployment(deployment_id)

    applied = asyncio.run(read())
    # two clicks on "Run" queue the second run rather than run both at once
    limit = applied.global_concurrency_limit.limit if applied.global_concurrency_limit else applied.concurrency_limit
    assert limit == 1 and applied.concurrency_options.collision_strategy.value == "ENQUEUE"
    schema = applied.parameter_openapi_schema
    assert {"params", "workspace"} <= set(schema["properties"])
    definitions = schema.get("definitions") or schema.get("$defs")
    assert "k" in definitions["SampleParams"]["properties"]
    assert definitions["SampleParams"]["properties"]["k"]["exclusiveMinimum"] == 0


def test_model_version_records_its_training_mode_and_data(looped):
    import json

    root, _ = looped
    client, name = _registry(root)
    tags = client.get_model_version(name, "2").tags
    assert tags["training.mode"] == "rft" and client.get_model_version(name, "1").tags["training.mode"] == "sft"
    assert "reference" in json.loads(tags["training.data"])
    assert json.loads(tags["training.replay"]) == {}  # the first iteration has nothing earlier to replay


def test_replay_reads_an_earlier_batch_through_dvc_and_the_loop_names_it(looped, tmp_path):
    """The next iteration replays the experiment of this one: params.yaml names it, and the train
    stage reads that version of the training set through DVC, not the file in the workspace."""
    import shutil

    from closedloop.lineage.record import begin_iteration
    from closedloop.workspace import TRAIN_SET, Workspace

    root, result = looped
    experiment = result["iterations"][0]["experiment"]
    copy = tmp_path / "ws"
    shutil.copytree(root, copy, symlinks=True)
    saved = (root.parent / ITERATION_1_TRAIN_SET).read_text()
    assert saved  # unsolved tasks' references at least
    (copy / TRAIN_SET).write_text('{"source": "positive", "prompt": "changed", "completion": "since"}\n')
    assert DvcWorkspace(copy).read_at(TRAIN_SET, experiment) == saved
    params = load_params(copy)
    nxt, _ = begin_iteration(Workspace.at(copy), params, params)
    assert nxt.train.replay.versions == [experiment] and load_params(copy).train.replay.versions == [experiment]


def test_a_passing_batch_logs_its_validation_report_not_its_data_docs(looped):
    """The Data Docs (4 MB of static files, the same every iteration) stay in DVC; the report is logged."""
    root, result = looped
    client, _ = _registry(root)
    reports = [a.path for a in client.list_artifacts(result["iterations"][0]["run_id"], "reports")]
    assert "reports/report.json" in reports and "reports/gate.json" in reports
    assert not any(path.startswith("reports/docs") for path in reports)


def test_a_resumed_iteration_keeps_the_champion_it_began_with(looped, tmp_path):
    """Killed after its own promote stage wrote next_champion, an iteration must not take its own
    candidate as its champion when resumed; a fresh iteration does take the promoted one."""
    import shutil

    from closedloop.lineage.record import close_loop
    from closedloop.models.loading import model_fingerprint
    from closedloop.workspace import Workspace

    root, _ = looped
    copy = tmp_path / "ws"
    shutil.copytree(root, copy, symlinks=True)
    ws = Workspace.at(copy)
    began_with = model_fingerprint(ws.champion)
    shutil.rmtree(ws.next_champion, ignore_errors=True)
    shutil.copytree(ws.candidate, ws.next_champion)  # what promote writes when the gate promotes
    promoted = model_fingerprint(ws.next_champion)
    assert promoted != began_with
    assert close_loop(ws, closed=began_with) == began_with and model_fingerprint(ws.champion) == began_with
    assert close_loop(ws) == promoted and model_fingerprint(ws.champion) == promoted  # the next iteration
    assert DvcWorkspace(copy).status().get("data/champion.dvc") is None  # and recorded in data/champion.dvc
