"""Shards on a real local Ray cluster give the batch one machine gives: the same samples.jsonl and
rewards.jsonl under execution.backend ray as under local, with 1 and 3 shards, and when a Ray worker
is killed mid-shard (its work done, its result lost) and the shard runs again."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from closedloop.io import read_json, replace_dir
from closedloop.stages import run_stage
from closedloop.workspace import Workspace

BATCH = ("data/batch/samples.jsonl", "data/batch/rollouts.jsonl", "data/batch/rewards.jsonl")


def _params(**execution) -> dict:
    from tests.conftest import TINY
    import copy

    data = copy.deepcopy(TINY)
    # 2 prompts decoded together (k 2): 10 tasks are 5 batches, so 3 shards cut between batches.
    data["sample"]["batch_size"] = 4
    data["execution"] = execution
    return data


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    """A workspace through the warm start and the generate stage: what sample and reward read."""
    root = tmp_path_factory.mktemp("execution") / "warm"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(_params()))
    ws = Workspace.at(root)
    for name in ("benchmark", "warmstart"):
        run_stage(name, root)
    replace_dir(ws.warmstart_model, ws.champion)
    run_stage("generate", root)
    return root


def _batch_of(warm: Path, where: Path, stages=("sample", "reward"), **execution) -> dict[str, str]:
    """The hashes of the batch files ``stages`` wrote in a copy of ``warm`` run with ``execution``."""
    shutil.copytree(warm, where)
    (where / "params.yaml").write_text(yaml.safe_dump(_params(**execution)))
    for name in stages:
        run_stage(name, where)
    return {path: hashlib.sha256((where / path).read_bytes()).hexdigest() for path in BATCH if (where / path).exists()}


@pytest.fixture(scope="module")
def local_ws(warm, tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("local") / "ws"
    _batch_of(warm, where, backend="local", shards=1)
    return where


@pytest.fixture(scope="module")
def local_batch(local_ws) -> dict[str, str]:
    return {path: hashlib.sha256((local_ws / path).read_bytes()).hexdigest() for path in BATCH}


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster in this process (4 logical CPUs: 2 actors and a task beside them)."""
    import ray

    context = ray.init(num_cpus=4, include_dashboard=False, logging_level="warning")
    yield context.address_info["gcs_address"]
    ray.shutdown()


def test_three_local_shards_give_the_unsharded_batch(warm, local_batch, tmp_path):
    assert _batch_of(warm, tmp_path / "ws", backend="local", shards=3) == local_batch
    info = read_json(tmp_path / "ws" / "metrics/info/sample.json")
    assert info["execution"] == "local, 3 shard(s)"


def test_ray_gives_the_batch_one_machine_gives(warm, local_batch, ray_cluster, tmp_path, shards=3):
    # 1 and 3 shards locally, 3 here and 2 through the stage command below: one batch throughout.
    assert _batch_of(warm, tmp_path / "ws", backend="ray", shards=shards, ray={"workers": 2}) == local_batch
    assert read_json(tmp_path / "ws" / "metrics/info/sample.json")["execution"] == f"ray, {shards} shard(s)"


@pytest.mark.parametrize("point,stage", [("shard:SampleWorker:1", "sample"), ("shard:VerifierWorker:2", "reward")])
def test_a_killed_worker_s_shard_runs_again_with_the_same_result(warm, local_ws, local_batch, ray_cluster, tmp_path,
                                                                monkeypatch, point, stage):
    marker = tmp_path / "killed"
    monkeypatch.setenv("CLOSEDLOOP_FAULT", point)
    monkeypatch.setenv("CLOSEDLOOP_FAULT_MARKER", str(marker))
    if stage == "reward":  # the reward stage alone, on the local run's samples
        source = tmp_path / "sampled"
        shutil.copytree(warm, source)
        for path in ("data/batch/samples.jsonl", "data/batch/rollouts.jsonl"):
            shutil.copy(local_ws / path, source / path)
        warm = source
    batch = _batch_of(warm, tmp_path / "ws", stages=(stage,), backend="ray", shards=3, ray={"workers": 2, "retries": 1})
    assert marker.exists(), f"no worker reached {point}: the fault never fired"
    assert batch == {path: digest for path, digest in local_batch.items() if path in batch}
    assert len(batch) == 3 if stage == "reward" else len(batch) == 2


def test_a_worker_lost_more_often_than_retries_allow_fails_the_stage_naming_the_key(warm, ray_cluster, tmp_path,
                                                                                   monkeypatch):
    from closedloop.execution.base import ExecutionError

    monkeypatch.setenv("CLOSEDLOOP_FAULT", "shard:SampleWorker:0")  # no marker: it fires every time
    with pytest.raises(ExecutionError, match="execution.ray.retries"):
        _batch_of(warm, tmp_path / "ws", stages=("sample",), backend="ray", shards=2, ray={"workers": 1, "retries": 0})
    assert not (tmp_path / "ws" / "data/batch/samples.jsonl").exists()  # nothing half-written


def test_the_stage_command_joins_a_cluster_by_its_address(warm, local_ws, local_batch, ray_cluster, tmp_path):
    """`closedloop stage NAME` (what `dvc repro` runs) in its own process joins the cluster at
    execution.ray.address (sample, and train on a Ray task there); the candidate is the one trained
    locally, and the benchmark evaluation sharded on the cluster counts the same passes."""
    where = tmp_path / "ws"
    shutil.copytree(warm, where)
    (where / "params.yaml").write_text(yaml.safe_dump(_params(backend="ray", shards=2,
                                                              ray={"address": ray_cluster, "workers": 2})))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    def stage_command(name: str) -> None:
        done = subprocess.run([str(bin_dir / "closedloop"), "stage", name], cwd=where, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr

    stage_command("sample")
    for name in ("reward", "grade", "validate"):  # in this process, on the same cluster (cheaper)
        run_stage(name, where)
    stage_command("train")
    run_stage("evaluate", where)
    got = {path: hashlib.sha256((where / path).read_bytes()).hexdigest() for path in BATCH}
    assert got == local_batch
    import torch

    # A Ray task given 1 CPU runs torch on 1 thread (Ray sets OMP_NUM_THREADS); training's float
    # reductions depend on the thread count, so the local run it is compared with uses 1 as well.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in ("grade", "validate", "train", "evaluate"):
            run_stage(name, local_ws)
    finally:
        torch.set_num_threads(threads)
    trained = read_json(where / "metrics/info/train.json")
    assert trained["execution"] == "ray task (1 CPU, 0 GPU)"
    assert read_json(local_ws / "metrics/info/train.json")["execution"] == "local"
    assert trained["model_version"] == read_json(local_ws / "metrics/info/train.json")["model_version"]
    # The benchmark sampled and verified in shards on the cluster: the same passes, task by task.
    evaluated, local = (read_json(Workspace.at(root).evaluation) for root in (where, local_ws))
    assert {role: evaluated[role]["per_task"] for role in evaluated} == {role: local[role]["per_task"] for role in local}
