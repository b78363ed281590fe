"""Pre-flight checks before an iteration's first stage: real git, DVC and a local DVC remote.

Corruption is made as it happens: garbage written in place into a cache object, which with a linked
cache is also the workspace file (one inode)."""

from __future__ import annotations

import hashlib
import os
import socket
import time

import pytest

from closedloop import workspace as paths
from closedloop.io import write_jsonl
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.preflight import PreflightError, preflight
from tests.conftest import tiny_params
from tests.unit.test_dvc_workspace import EXPERIMENT, TRAIN_ROWS, cache_object, corrupt, saved, ws  # noqa: F401

REPLAYING = {"replay": {"versions": [EXPERIMENT]}}  # train.mode is rft by default


def remote_object(root, md5):
    return root / ".dvc-remote" / "files" / "md5" / md5[:2] / md5[2:]


def md5_of(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TestHealthy:
    def test_nothing_to_report_and_cheap(self, ws) -> None:
        for run in ("first", "again"):  # again: the files' hashes come from the memo (their ctimes held)
            started = time.perf_counter()
            assert preflight(ws, tiny_params(train=REPLAYING)) == []
            print(f"preflight of a healthy tiny workspace ({run}): {(time.perf_counter() - started) * 1000:.0f} ms")

    def test_the_hash_memo_does_not_hide_a_file_written_since(self, ws) -> None:
        assert preflight(ws, tiny_params()) == []
        before = (ws / paths.BENCHMARK_TASKS).stat()
        corrupt(ws / paths.BENCHMARK_TASKS)  # the same size, and the mtime set back: only the ctime moves
        os.utime(ws / paths.BENCHMARK_TASKS, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = (ws / paths.BENCHMARK_TASKS).stat()
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        notes = preflight(ws, tiny_params())
        assert any(note.startswith(f"{paths.BENCHMARK_TASKS}: its bytes hash to") for note in notes), notes

    def test_before_the_warm_start_the_champion_check_does_not_apply(self, workspace) -> None:
        from tests.unit.test_weights_on_disk import commit_stage

        commit_stage(workspace, "benchmark", {paths.BENCHMARK_TASKS: [{"task_id": "t0"}]})
        assert not (workspace / (paths.CHAMPION + ".dvc")).exists()
        assert preflight(workspace, tiny_params()) == []


class TestReplayedBatches:
    @pytest.mark.parametrize("where", [
        "linked",  # the workspace's train set is the replayed version: the same inode as the object
        "cache only",  # the workspace moved on: the replayed version lives in the cache alone
    ])
    def test_a_corrupt_object_is_fetched_again_from_the_remote(self, ws, where) -> None:
        dvc = DvcWorkspace(ws)
        md5 = dvc.recorded_out(paths.TRAIN_SET, version=EXPERIMENT)["md5"]
        if where == "cache only":
            write_jsonl(ws / paths.TRAIN_SET, [{**TRAIN_ROWS[0], "completion": "another"}])
            dvc.commit("grade")
        corrupt(cache_object(ws, md5))

        notes = preflight(ws, tiny_params(train=REPLAYING))

        assert any(f"experiment {EXPERIMENT!r}, {paths.TRAIN_SET}" in note and "was corrupt" in note
                   and "fetched a good copy from the remote" in note for note in notes), notes
        assert md5_of(cache_object(ws, md5)) == md5
        assert DvcWorkspace(ws).read_at(paths.TRAIN_SET, EXPERIMENT).count("\n") == len(TRAIN_ROWS)
        if where == "linked":  # the workspace file had the corrupt bytes: it links the good ones now
            assert any(note.startswith(f"{paths.TRAIN_SET}: linked the corrupt bytes") for note in notes), notes
            assert md5_of(ws / paths.TRAIN_SET) == md5
        assert "grade" not in dvc.status()
        assert preflight(ws, tiny_params(train=REPLAYING)) == []

    def test_corrupt_in_the_remote_too_names_experiment_file_and_object(self, ws) -> None:
        md5 = DvcWorkspace(ws).recorded_out(paths.TRAIN_SET, version=EXPERIMENT)["md5"]
        corrupt(cache_object(ws, md5))
        corrupt(remote_object(ws, md5))
        with pytest.raises(PreflightError) as error:
            preflight(ws, tiny_params(train=REPLAYING))
        message = str(error.value)
        assert f"train.replay.versions: experiment {EXPERIMENT!r}, {paths.TRAIN_SET}" in message
        assert f"cache object .dvc/cache/files/md5/{md5[:2]}/{md5[2:]} is corrupt" in message
        assert "holds a corrupt copy too" in message

    def test_an_unknown_experiment_and_a_mode_that_does_not_replay(self, ws) -> None:
        with pytest.raises(PreflightError, match="no DVC experiment named 'iter-999-nothere'"):
            preflight(ws, tiny_params(train={"replay": {"versions": ["iter-999-nothere"]}}))
        # grpo does not read replayed batches: nothing of them is checked
        assert preflight(ws, tiny_params(train={"mode": "grpo", "replay": {"versions": ["iter-999-nothere"]}})) == []


class TestBenchmarkAndChampion:
    def test_a_deleted_benchmark_file_is_named(self, ws) -> None:
        (ws / paths.BENCHMARK_TASKS).unlink()
        missing = rf"{paths.BENCHMARK_TASKS}: missing \(dvc.lock records md5 [0-9a-f]{{32}}\)"
        with pytest.raises(PreflightError, match=missing):
            preflight(ws, tiny_params())

    def test_corrupt_champion_weights_are_repaired_with_every_link(self, ws) -> None:
        """The champion's weights, the warm start's and their cache object are one inode: all three
        had the corrupt bytes; all get the good ones (close_loop would copy them back otherwise)."""
        dvc = DvcWorkspace(ws)
        weights = ws / paths.CHAMPION / "model.safetensors"
        md5 = dvc.dir_entries(dvc.recorded_out(paths.CHAMPION)["md5"])["model.safetensors"]
        warm = ws / paths.WARMSTART_MODEL / "model.safetensors"
        assert weights.stat().st_ino == warm.stat().st_ino == cache_object(ws, md5).stat().st_ino
        corrupt(weights)

        notes = preflight(ws, tiny_params())

        assert any(note.startswith(f"{paths.CHAMPION}/model.safetensors: its bytes hash to") and
                   "fetched a good copy from the remote" in note and "replaced it with the good copy" in note
                   for note in notes), notes
        assert any(note.startswith(f"{paths.WARMSTART_MODEL}/model.safetensors: linked the corrupt bytes")
                   for note in notes), notes
        assert md5_of(weights) == md5_of(warm) == md5_of(cache_object(ws, md5)) == md5
        assert weights.stat().st_ino == warm.stat().st_ino == cache_object(ws, md5).stat().st_ino  # linked again
        status = dvc.status()
        assert paths.CHAMPION + ".dvc" not in status and "warmstart" not in status

    def test_corrupt_champion_weights_without_a_good_copy_are_named(self, ws) -> None:
        dvc = DvcWorkspace(ws)
        md5 = dvc.dir_entries(dvc.recorded_out(paths.CHAMPION)["md5"])["model.safetensors"]
        corrupt(ws / paths.CHAMPION / "model.safetensors")
        corrupt(remote_object(ws, md5))
        with pytest.raises(PreflightError) as error:
            preflight(ws, tiny_params())
        assert (f"{paths.CHAMPION}/model.safetensors: its bytes hash to" in str(error.value)
                and f"not the md5 {md5} {paths.CHAMPION}.dvc records" in str(error.value))


class TestTrackingStore:
    def test_an_unreachable_server_fails_fast_naming_the_uri(self, ws, monkeypatch) -> None:
        uri = f"http://127.0.0.1:{closed_port()}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        started = time.perf_counter()
        with pytest.raises(PreflightError) as error:
            preflight(ws, tiny_params())
        assert time.perf_counter() - started < 10.0  # preflight.check_store's timeout
        assert f"MLflow tracking store {uri} cannot be reached" in str(error.value)
        assert "the URI is MLFLOW_TRACKING_URI" in str(error.value)

    def test_every_problem_in_one_message(self, ws) -> None:
        (ws / paths.BENCHMARK_TASKS).unlink()
        uri = f"http://127.0.0.1:{closed_port()}/"
        with pytest.raises(PreflightError) as error:
            preflight(ws, tiny_params(tracking={"uri": uri}))
        message = str(error.value)
        assert message.startswith("pre-flight found 2 problem(s)")
        assert f"{paths.BENCHMARK_TASKS}: missing" in message and "the URI is tracking.uri in params.yaml" in message

    @pytest.mark.parametrize("uri, fails", [
        ("sqlite:////nonexistent-dir/mlflow.db", "the directory /nonexistent-dir does not exist"),  # no directory
        ("sqlite:///{ws}/mlflow.db", None),  # the default's form: the directory exists, the DB need not
        ("file:///nonexistent-dir/deeper/mlruns", None),  # made by MLflow under a writable parent
        ("postgresql://nobody@127.0.0.1/x", None),  # other schemes are not checked here
    ])
    def test_check_store(self, ws, uri, fails) -> None:
        from closedloop.lineage.preflight import check_store

        uri = uri.format(ws=ws)
        if fails is None:
            assert check_store(ws, uri) == uri
            assert not (ws / "mlflow.db").exists()
        else:
            with pytest.raises(ConnectionError, match=fails):
                check_store(ws, uri)
