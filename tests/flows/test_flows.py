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


def _published(root, key: str) -> list:
    """The Prefect artifacts under ``key`` that this workspace's flow runs published. The test run's
    server is shared (tests/conftest.py), and other tests' workspaces publish the same keys."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
            runs = {run_id: await client.read_flow_run(run_id) for run_id in {a.flow_run_id for a in found}}
        return [a for a in found if runs[a.flow_run_id].parameters.get("workspace") == str(root)]

    return asyncio.run(read())


ITERATION_1_TRAIN_SET = "iteration-1-train_set.jsonl"


@pytest.fixture(scope="module")
def looped(warm_copy, tmp_path_factory):
    """A copy of the warm-started template (tests/conftest.py) after one iteration run by the loop flow."""
    import shutil

    from closedloop.workspace import TRAIN_SET
    from flows.loop import closed_loop

    root = warm_copy(tmp_path_factory.mktemp("flow") / "ws")
    result = closed_loop(iterations=1, workspace=str(root))
    # What iteration 1 trained on, kept aside: a later test runs another (failing) iteration in root.
    shutil.copy(root / TRAIN_SET, root.parent / ITERATION_1_TRAIN_SET)
    return root, result


def test_loop_result_names_the_iteration(looped, warm_template):
    root, result = looped
    # The loop flow warm-started the template; on a workspace with a champion it does not again.
    assert warm_template[1]["warm_start"]["model_version"] == "1" and not warm_template[1]["iterations"]
    assert result["warm_start"] is None
    (it,) = result["iterations"]
    assert it["iteration"] == 1 and it["model_version"] == "2"
    assert load_params(root).loop.iteration == 1


def test_the_model_an_iteration_ends_with_is_its_promote_output_not_data_champion(looped, warm_template):
    # benchmarks/learning.py measures each arm's final model: data/champion lags one iteration behind
    # (the loop closes when the next iteration begins), so after the last iteration it is still the
    # model that iteration started from.
    import json
    import sys

    from closedloop.models.loading import model_fingerprint
    from closedloop.workspace import Workspace

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import learning

    root, _ = looped
    ws = Workspace.at(root)
    gate = json.loads(ws.gate.read_text())
    ended = ws.candidate if gate["promote"] else ws.champion
    assert learning.final_model(ws) == ws.next_champion  # the promote stage's output
    assert model_fingerprint(learning.final_model(ws)) == model_fingerprint(ended)
    assert model_fingerprint(ws.champion) == model_fingerprint(Workspace.at(warm_template[0]).warmstart_model)
    if gate["promote"]:
        assert model_fingerprint(learning.final_model(ws)) != model_fingerprint(ws.champion)


def test_dvc_is_clean_after_a_prefect_iteration(looped):
    root, _ = looped
    assert DvcWorkspace(root).status() == {}


def test_iteration_saved_as_experiment_and_pushed(looped):
    root, result = looped
    assert result["iterations"][0]["experiment"] in DvcWorkspace(root).experiments()
    assert any((root / ".dvc-remote").rglob("*")), "nothing was pushed to the local DVC remote"


def test_registry_versions_carry_lineage_tags_and_aliases_follow_the_gate(looped):
    import json

    root, result = looped
    client, name = _registry(root)
    version = client.get_model_version(name, "2")
    tags = version.tags
    assert len(tags) <= 12 and len(client.get_model_version(name, "1").tags) <= 12
    for key in ("iteration", "model.fingerprint", "parent.version", "dvc.model", "dvc.data", "git.rev",
                "feedback_sources", "benchmark.pass_at_1", "dvc.experiment", "dvc.exp_rev"):
        assert tags.get(key), f"model version 2 lacks tag {key}"
    assert tags["parent.version"] == "1"  # the warm start it was compared with, by its registry version
    assert "verifier:code" in tags["feedback_sources"] and "validator:batch" in tags["feedback_sources"]
    data = json.loads(tags["dvc.data"])  # the batch's DVC hashes, one JSON object
    assert {"tasks", "samples", "rewards", "graded", "train_set"} <= set(data)
    lock = (root / "dvc.lock").read_text()
    assert data["samples"] and data["samples"] in lock and tags["dvc.model"] in lock
    # the description states the gate decision in a sentence, naming the champion by its version
    decision = "Promoted: " if result["iterations"][0]["promoted"] else "Held: "
    assert version.description.startswith(decision) and "vs champion v1 " in version.description
    assert version.description == result["iterations"][0]["decision"]
    assert client.get_model_version(name, "1").description.startswith("Warm start (iteration 0), the first champion")
    assert str(client.get_model_version_by_alias(name, "challenger").version) == "2"
    expected_champion = "2" if result["iterations"][0]["promoted"] else "1"
    assert str(client.get_model_version_by_alias(name, "champion").version) == expected_champion


def test_mlflow_run_has_metrics_datasets_and_plot(looped):
    root, result = looped
    client, _ = _registry(root)
    run = client.get_run(result["iterations"][0]["run_id"])
    from closedloop.lineage.run_metrics import CHAMPION_PASS_AT_1, PASS_AT_1, PROMOTED, REWARD_MEAN
    from closedloop.pipeline import ITERATION_STAGES

    metrics = run.data.metrics
    # The headline: the candidate's and champion's benchmark pass@1, promoted, the batch's reward mean.
    for key in (PASS_AT_1, CHAMPION_PASS_AT_1, PROMOTED, REWARD_MEAN, "stage/grade/reward_std",
                "stage/grade/pass_rate.code", "stage/grade/buckets.positive", "system/sample/tokens_per_s",
                "system/sample/samples_per_s"):
        assert key in metrics, f"run lacks metric {key}"
    assert metrics[PROMOTED] == float(result["iterations"][0]["promoted"])
    assert metrics[PASS_AT_1] == pytest.approx(result["iterations"][0]["candidate_pass@1"])
    # Pass rate per environment and per slice, and each environment's reward components.
    for env in ("code", "data", "script", "extract", "rules"):
        for key in (f"{PASS_AT_1}.{env}", f"{CHAMPION_PASS_AT_1}.{env}", f"stage/evaluate/candidate_pass_at_1.{env}.core",
                    f"stage/evaluate/candidate_pass_at_1.{env}.edge",
                    f"stage/evaluate/candidate_pass_at_1.{env}.failure_modes",
                    f"stage/grade/pass_rate.{env}", f"stage/reward/per_env.{env}.reward_mean"):
            assert key in metrics, f"run lacks metric {key}"
    assert {"stage/reward/per_env.data.components.values", "stage/reward/per_env.rules.components.decision"} <= set(metrics)
    # Each stage's wall clock, CPU and memory (stage_files' timing files); every figure once.
    for stage in ITERATION_STAGES:
        assert {f"timing/{stage}", f"system/{stage}/cpu_seconds", f"system/{stage}/peak_rss_mb"} <= set(metrics), stage
    assert not [key for key in metrics if "reward_mean" in key and key != REWARD_MEAN and "per_env" not in key]
    # One point per iteration: every metric at step 1; the run spans the iteration, not its logging.
    assert {h.step for h in client.get_metric_history(run.info.run_id, PASS_AT_1)} == {1}
    stage_seconds = sum(metrics[f"timing/{stage}"] for stage in ITERATION_STAGES)
    assert (run.info.end_time - run.info.start_time) / 1000 >= stage_seconds
    digests = {d.dataset.name: d.dataset.digest for d in run.inputs.dataset_inputs}
    assert {"tasks", "samples", "rewards", "graded"} <= set(digests)
    assert digests["samples"] and digests["samples"] in (root / "dvc.lock").read_text()
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
    assert "plots/reward_hist.png" in artifacts


def test_gate_report_artifact_published(looped):
    from closedloop.io import read_json
    from closedloop.workspace import Workspace

    root, result = looped
    artifacts = _published(root, "gate-iteration-1")
    assert artifacts and artifacts[0].type == "markdown"
    text, summary = artifacts[0].data, result["iterations"][0]
    assert artifacts[0].description == summary["decision"] and summary["decision"] in text
    assert "| environment | champion v1 | candidate v2 |" in text and "| code/edge |" in text
    assert f"`{summary['run_id']}`" in text and "mlflow ui --backend-store-uri sqlite:///" in text
    gate = read_json(Workspace.at(root).gate)
    for role in ("champion", "candidate"):  # registry versions, not fingerprints
        assert gate[role]["model_version"] not in text


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
    data = json.loads(tags["training.data"])
    assert "reference" in data["examples"]
    assert data["replay"] == {}  # the first iteration has nothing earlier to replay


def test_replay_reads_an_earlier_batch_through_dvc_and_the_loop_names_it(looped, tmp_path):
    """The next iteration replays the experiment of this one: params.yaml names it, and the train
    stage reads that version of the training set through DVC, not the file in the workspace."""
    import shutil

    from closedloop.versioning.resume import begin_iteration
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

    from closedloop.versioning.loop import close_loop
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


def test_monitors_artifact_published(looped):
    """The monitors' table of iteration 1 as a Markdown artifact beside the gate's, and their values in
    the iteration's MLflow run at step 1."""
    from closedloop.io import read_json
    from closedloop.workspace import Workspace

    root, result = looped
    artifacts = _published(root, "monitors-iteration-1")
    assert artifacts and artifacts[0].type == "markdown"
    report = read_json(Workspace.at(root).monitors_report)
    assert report["iteration"] == 1 and "| monitor | verdict | value |" in artifacts[0].data
    for monitor in report["monitors"]:
        assert f"| {monitor['name']} v{monitor['version']} | " in artifacts[0].data
    client, _ = _registry(root)
    run = client.get_run(result["iterations"][0]["run_id"])
    assert {f"stage/monitors/{m['name']}.verdict_code" for m in report["monitors"]} <= set(run.data.metrics)
    assert {f"monitor/{m['name']}" for m in report["monitors"] if m["value"] is not None} <= set(run.data.metrics)
    assert {key for key in run.data.tags if key.startswith("monitor.")} == {
        f"monitor.{m['name']}" for m in report["monitors"] if m["verdict"] in ("fail", "warn")}
