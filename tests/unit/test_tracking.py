"""The MLflow adapter against a real SQLite store in a temporary workspace (one store per module:
creating its tables costs seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
mlflow = pytest.importorskip("mlflow")

from closedloop.lineage import mlflow_layout as layout  # noqa: E402
from closedloop.lineage import tracking  # noqa: E402
from closedloop.lineage.run_metrics import PASS_AT_1  # noqa: E402

EXPERIMENT = "closedloop-test"
MODEL = "closedloop-policy"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory):
    """A configured workspace; the process-wide tracking URI is restored afterwards."""
    saved_env = os.environ.pop("MLFLOW_TRACKING_URI", None)
    saved_uri = mlflow.get_tracking_uri()
    ws = tmp_path_factory.mktemp("ws")
    uri = tracking.configure(ws, None, EXPERIMENT)
    yield ws, uri
    mlflow.set_tracking_uri(saved_uri)
    # set_tracking_uri exports MLFLOW_TRACKING_URI too: left set, the tests after these (test_preflight's
    # store checks) would resolve to this module's store.
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    if saved_env is not None:
        os.environ["MLFLOW_TRACKING_URI"] = saved_env


@pytest.fixture(scope="module")
def iteration_run(workspace, tmp_path_factory: pytest.TempPathFactory) -> dict:
    reports = tmp_path_factory.mktemp("reports")
    (reports / "gate.json").write_text('{"promote": true}')
    docs = reports / "data_docs"
    docs.mkdir()
    (docs / "index.html").write_text("<html></html>")
    frame = pd.DataFrame({"sample_id": ["a", "b"], "reward": [0.0, 1.0]})
    run_id = tracking.log_iteration(
        iteration=3,
        run_name="iter-3",
        params={"sample": {"k": 8, "temperature": 0.7}, "train": {"lr": 1e-4, "stages": ["a", "b"]}, "long": "x" * 7000},
        metrics={"pass_at_1": 0.25},
        tags={"closedloop.batch": "b0003"},
        rewards=[0.0, 0.5, 1.0, 1.0],
        datasets=[layout.DatasetInput("graded", "data/batches/b0003/graded.parquet", "0123abcd", "training", frame)],
        artifacts=[reports / "gate.json", docs],
        stage_seconds={"sample": 1.5, "grade": 0.25},
    )
    return {"run_id": run_id}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (random) Llama with a WordLevel tokenizer, built locally: no downloads."""
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<unk>", "<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(96)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    config = LlamaConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        bos_token_id=2, eos_token_id=3, pad_token_id=1,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class TestTrackingUri:
    @pytest.mark.parametrize(
        "env, uri, expected",
        [
            ("sqlite:///env.db", "sqlite:///arg.db", "sqlite:///env.db"),  # the environment wins
            (None, "sqlite:///arg.db", "sqlite:///arg.db"),  # then the configured uri
            (None, None, "sqlite:///{ws}/mlflow.db"),  # then a store inside the workspace
        ],
    )
    def test_precedence(self, monkeypatch, tmp_path, env, uri, expected) -> None:
        if env is None:
            monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        else:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
        assert layout.tracking_uri(tmp_path, uri) == expected.format(ws=tmp_path.resolve())


class TestFlattenParams:
    def test_nested_lists_and_long_values(self) -> None:
        flat = layout.flatten_params({"a": {"b": 1, "c": {"d": True}}, "l": [1, 2], "s": "y" * 7000})
        assert flat["a.b"] == "1" and flat["a.c.d"] == "True" and flat["l"] == "[1, 2]"
        assert len(flat["s"]) == 6000 and flat["s"].endswith("[truncated]")


class TestConfigure:
    def test_creates_store_and_experiment_inside_workspace(self, workspace) -> None:
        ws, uri = workspace
        assert uri == f"sqlite:///{ws.resolve()}/mlflow.db"
        assert (ws / "mlflow.db").is_file()
        exp = mlflow.MlflowClient(uri).get_experiment_by_name(EXPERIMENT)
        assert exp is not None and exp.artifact_location == (ws.resolve() / "mlartifacts").as_uri()
        assert tracking.configure(ws, None, EXPERIMENT) == uri  # idempotent

    def test_a_second_workspace_gets_its_own_store(self, workspace, tmp_path) -> None:
        ws, uri = workspace
        other = tracking.configure(tmp_path / "other", None, EXPERIMENT)
        try:
            assert other == f"sqlite:///{(tmp_path / 'other').resolve()}/mlflow.db" != uri
            assert mlflow.get_tracking_uri() == other and "MLFLOW_TRACKING_URI" not in os.environ
        finally:
            assert tracking.configure(ws, None, EXPERIMENT) == uri


class TestLogIteration:
    def test_params_metrics_tags(self, workspace, iteration_run) -> None:
        run = mlflow.MlflowClient().get_run(iteration_run["run_id"])
        assert run.info.run_name == "iter-3" and run.info.status == "FINISHED"
        assert run.data.params["sample.k"] == "8" and run.data.params["train.stages"] == '["a", "b"]'
        assert run.data.params["long"].endswith("[truncated]")
        m = run.data.metrics
        assert m == {"pass_at_1": 0.25, "timing/sample": 1.5, "timing/grade": 0.25}  # the rewards are the histogram's
        assert run.data.tags["closedloop.batch"] == "b0003" and run.data.tags[layout.ITERATION_TAG] == "3"
        steps = {key: [h.step for h in mlflow.MlflowClient().get_metric_history(run.info.run_id, key)] for key in m}
        assert steps == {key: [3] for key in m}  # every metric at step = iteration

    def test_dataset_input_keeps_dvc_digest(self, workspace, iteration_run) -> None:
        inputs = mlflow.MlflowClient().get_run(iteration_run["run_id"]).inputs.dataset_inputs
        assert len(inputs) == 1
        assert inputs[0].dataset.name == "graded" and inputs[0].dataset.digest == "0123abcd"
        assert {t.key: t.value for t in inputs[0].tags}["mlflow.data.context"] == "training"

    def test_artifacts_histogram_and_reports(self, workspace, iteration_run) -> None:
        client = mlflow.MlflowClient()
        run_id = iteration_run["run_id"]
        assert {a.path for a in client.list_artifacts(run_id, "plots")} == {layout.HIST_ARTIFACT}
        reports = {a.path for a in client.list_artifacts(run_id, "reports")}
        assert reports == {"reports/gate.json", "reports/data_docs"}
        run = client.get_run(run_id)
        ws, _ = workspace
        assert run.info.artifact_uri.startswith((ws.resolve() / "mlartifacts").as_uri())

    def test_missing_artifact_fails_before_a_run_starts(self, workspace, tmp_path) -> None:
        before = len(tracking.recent_iterations(EXPERIMENT, limit=100))
        with pytest.raises(FileNotFoundError, match="nope.json"):
            tracking.log_iteration(
                iteration=0, run_name="bad", params={}, metrics={}, tags={}, rewards=[], datasets=[],
                artifacts=[tmp_path / "nope.json"], stage_seconds={},
            )
        assert len(tracking.recent_iterations(EXPERIMENT, limit=100)) == before

    def test_failed_iteration_keeps_its_status(self, workspace) -> None:
        run_id = tracking.log_iteration(
            iteration=4, run_name="iter-4-failed", params={}, metrics={}, tags={"closedloop.failed_stage": "validate"},
            rewards=[], datasets=[], artifacts=[], stage_seconds={}, status="FAILED",
        )
        assert mlflow.MlflowClient().get_run(run_id).info.status == "FAILED"


class TestRegistry:
    REFERENCE = {"path": "data/models/candidate", "md5": "0f" * 16 + ".dir", "size": 1234, "nfiles": 3,
                 "hash": "md5", "workspace": "/ws", "remote": "/ws/.dvc-remote", "git_rev": "abc123",
                 "dvc_file": "outs:\n- md5: " + "0f" * 16 + ".dir\n  hash: md5\n  path: candidate\n"}

    def test_log_and_register_model_with_tags(self, workspace, iteration_run, tiny_model_dir) -> None:
        version = tracking.log_and_register_model(
            run_id=iteration_run["run_id"], model_dir=tiny_model_dir, registered_model=MODEL,
            tags={"closedloop.batch": "b0003", "closedloop.validator": "abc123"}, reference=self.REFERENCE,
        )
        assert version == "1"
        assert tracking.model_version_tags(MODEL, version) == {
            "closedloop.batch": "b0003", "closedloop.validator": "abc123",
        }
        mv = mlflow.MlflowClient().get_model_version(MODEL, version)
        assert mv.run_id == iteration_run["run_id"]

        # aliases: set, read back, move
        assert tracking.get_alias(MODEL, "champion") is None  # model exists, alias does not
        tracking.set_alias(MODEL, "champion", version)
        assert tracking.get_alias(MODEL, "champion") == "1"

    def test_version_holds_a_dvc_reference_not_the_weights(self, workspace, iteration_run, tiny_model_dir,
                                                            tmp_path) -> None:
        version = tracking.log_and_register_model(
            run_id=iteration_run["run_id"], model_dir=tiny_model_dir, registered_model=MODEL, tags={},
            reference=self.REFERENCE,
        )
        files = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}/{version}", dst_path=str(tmp_path)))
        names = {p.name for p in files.rglob("*") if p.is_file()}
        assert {layout.REFERENCE_ARTIFACT, layout.POINTER_ARTIFACT} <= names
        assert not names & {p.name for p in tiny_model_dir.iterdir()}  # no config, weights or tokenizer
        assert sum(p.stat().st_size for p in files.rglob("*") if p.is_file()) < 10_000
        ref = tracking.model_reference(MODEL, version)
        assert ref["md5"] == self.REFERENCE["md5"] and ref["dvc_file"] == self.REFERENCE["dvc_file"]
        assert ref["path"] == "data/models/candidate" and ref["remote"] == "/ws/.dvc-remote"
        tracking.set_alias(MODEL, "challenger", version)
        assert tracking.model_reference(MODEL, "challenger")["md5"] == self.REFERENCE["md5"]
        mv = mlflow.MlflowClient().get_model_version(MODEL, version)
        assert mv.source.startswith("models:/m-")  # the version's source is the LoggedModel
        logged = mlflow.MlflowClient().get_logged_model(mv.source.removeprefix("models:/"))
        assert logged.tags[layout.WEIGHTS_TAG] == "dvc" and logged.tags["dvc.md5"] == self.REFERENCE["md5"]
        assert logged.source_run_id == iteration_run["run_id"]

    def test_a_version_needs_a_reference_unless_it_logs_the_weights(self, workspace, iteration_run,
                                                                     tiny_model_dir) -> None:
        with pytest.raises(ValueError, match="reference"):
            tracking.log_and_register_model(run_id=iteration_run["run_id"], model_dir=tiny_model_dir,
                                            registered_model=MODEL, tags={})

    def test_log_weights_logs_the_transformers_flavor_too(self, workspace, iteration_run, tiny_model_dir) -> None:
        version = tracking.log_and_register_model(
            run_id=iteration_run["run_id"], model_dir=tiny_model_dir, registered_model=MODEL, tags={},
            reference=self.REFERENCE, log_weights=True,
        )
        # the flavor wrote a loadable transformers model, not just files, and the reference beside it
        assert mlflow.models.get_model_info(f"models:/{MODEL}/{version}").flavors.keys() >= {"transformers"}
        assert tracking.model_reference(MODEL, version)["md5"] == self.REFERENCE["md5"]

    def test_get_alias_of_missing_model_is_none(self, workspace) -> None:
        assert tracking.get_alias("no-such-model", "champion") is None


class TestIterationsCompare:
    """What the MLflow UI draws across the runs of an experiment: one point per iteration, runs that
    last as long as their iterations did."""

    @pytest.fixture(scope="class")
    def two_iterations(self, workspace) -> dict[int, dict]:
        runs = {}
        for iteration, started, ended, value in ((1, 1_700_000_000_000, 1_700_000_600_000, 0.30),
                                                 (2, 1_700_001_000_000, 1_700_001_900_000, 0.35)):
            run_id = tracking.log_iteration(
                iteration=iteration, run_name=f"iteration-{iteration:03d}", params={}, tags={},
                metrics={PASS_AT_1: value, "stage/grade/samples": 8}, rewards=[], datasets=[], artifacts=[],
                stage_seconds={"train": 4.0}, started_ms=started,
            )
            tracking.end_run(run_id, ended_ms=ended)
            runs[iteration] = {"run_id": run_id, "started": started, "ended": ended, "value": value}
        return runs

    def test_metrics_are_at_step_iteration(self, two_iterations) -> None:
        client = mlflow.MlflowClient()
        for iteration, run in two_iterations.items():
            for key in (PASS_AT_1, "stage/grade/samples", "timing/train"):
                history = client.get_metric_history(run["run_id"], key)
                assert [h.step for h in history] == [iteration], key
            assert client.get_metric_history(run["run_id"], PASS_AT_1)[0].value == run["value"]

    def test_the_experiment_has_one_point_per_iteration(self, two_iterations) -> None:
        client = mlflow.MlflowClient()
        experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
        found = client.search_runs([experiment], filter_string=f"metrics.`{PASS_AT_1}` >= 0")
        points = sorted((h.step, h.value) for run in found for h in client.get_metric_history(run.info.run_id, PASS_AT_1))
        assert points == [(1, 0.30), (2, 0.35)]

    def test_the_run_spans_the_iteration(self, two_iterations) -> None:
        for run in two_iterations.values():
            info = mlflow.MlflowClient().get_run(run["run_id"]).info
            assert (info.start_time, info.end_time, info.status) == (run["started"], run["ended"], "FINISHED")

    def test_run_location(self, workspace, two_iterations) -> None:
        _, uri = workspace
        location = tracking.run_location(two_iterations[1]["run_id"])
        experiment = mlflow.MlflowClient().get_experiment_by_name(EXPERIMENT).experiment_id
        assert location == {"tracking_uri": uri, "experiment_id": experiment, "run_id": two_iterations[1]["run_id"],
                            "run_name": "iteration-001"}

    def test_end_run_refuses_an_unknown_status(self, two_iterations) -> None:
        with pytest.raises(ValueError, match="DONE"):
            tracking.end_run(two_iterations[1]["run_id"], status="DONE")

    def test_version_description(self, workspace, two_iterations, tiny_model_dir) -> None:
        version = tracking.log_and_register_model(run_id=two_iterations[2]["run_id"], model_dir=tiny_model_dir,
                                                  registered_model="described", tags={"iteration": "2"},
                                                  reference=TestRegistry.REFERENCE)
        sentence = "Promoted: benchmark pass@1 0.350 vs champion v1 0.300 (+5.0 pp); no environment or slice regressed."
        tracking.describe_model_version("described", version, sentence)
        tracking.describe_model_version("described", version, sentence)  # again, as a resumed run does
        assert tracking.model_version_description("described", version) == sentence
        assert tracking.model_version_tags("described", version) == {"iteration": "2"}


class TestHelpersAndStatus:
    def test_set_run_tags_log_metrics_and_recent_iterations(self, workspace, iteration_run) -> None:
        run_id = iteration_run["run_id"]
        tracking.set_run_tags(run_id, {"closedloop.decision": "promote"})
        tracking.log_metrics(run_id, {"gate.delta": 0.05})
        recent = tracking.recent_iterations(EXPERIMENT)
        assert [r["start_time"] for r in recent] == sorted((r["start_time"] for r in recent), reverse=True)
        row = next(r for r in recent if r["run_id"] == run_id)
        assert (row["run_name"], row["iteration"], row["status"]) == ("iter-3", 3, "FINISHED")
        assert row["metrics"]["gate.delta"] == 0.05 and row["metrics"]["pass_at_1"] == 0.25
        assert row["tags"]["closedloop.decision"] == "promote"
        assert not any(k.startswith("mlflow.") for k in row["tags"])

    def test_recent_iterations_of_unknown_experiment_is_empty(self, workspace) -> None:
        assert tracking.recent_iterations("no-such-experiment") == []
