"""Shards on a real local Ray cluster give the batch one machine gives: the same samples.jsonl and
rewards.jsonl under execution.backend ray as under local, with 1 and 3 shards, and when a Ray worker
is killed mid-shard (its work done, its result lost) and the shard runs again."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from closedloop.io import read_json, replace_dir
from closedloop.stages.common import run_stage
from closedloop.workspace import Workspace

BATCH = ("data/batch/samples.jsonl", "data/batch/rollouts.jsonl", "data/batch/rewards.jsonl")
ROLLOUTS = "data/batch/rollouts.jsonl"
# What "the same batch on Ray" promises: samples, rewards and every token exactly; the sampling
# log-probabilities within this much. A Ray worker given 1 CPU runs torch on 1 thread, the local
# stage on the machine's cores, and on some CPUs (AMD EPYC) float reductions round by thread count:
# 1e-6 apart in 3 of 20 rows was seen. The tokens drawn are the same (docs/scale-out.md, "Ray").
LOGPROB_TOLERANCE = 1e-5


def _contents(root: Path) -> dict:
    """Each batch file ``root`` has: its hash, and for rollouts its rows (compared within tolerance)."""
    from closedloop.io import read_jsonl

    return {path: read_jsonl(root / path) if path == ROLLOUTS else hashlib.sha256((root / path).read_bytes()).hexdigest()
            for path in BATCH if (root / path).exists()}


def _assert_same_batch(got: dict, expected: dict) -> None:
    """``got`` (some of the batch files) equals ``expected`` on those files, as LOGPROB_TOLERANCE says."""
    assert set(got) <= set(expected), f"unexpected files: {set(got) - set(expected)}"
    for path, value in got.items():
        if path != ROLLOUTS:
            assert value == expected[path], f"{path} differs"
            continue
        want = expected[path]
        assert len(value) == len(want)
        for row, other in zip(value, want):
            plain = {key: item for key, item in row.items() if key != "logprobs"}
            assert plain == {key: item for key, item in other.items() if key != "logprobs"}, f"{path}: {row['sample_id']}"
            if row.get("logprobs") is None or other.get("logprobs") is None:
                assert row.get("logprobs") == other.get("logprobs")
            else:
                assert row["logprobs"] == pytest.approx(other["logprobs"], abs=LOGPROB_TOLERANCE), row["sample_id"]


def _params(rounds: int = 1, **execution) -> dict:
    from tests.conftest import TINY
    import copy

    data = copy.deepcopy(TINY)
    # 2 prompts decoded together (k 2): 10 tasks are 5 batches, so 3 shards cut between batches.
    data["sample"]["batch_size"] = 4
    if rounds > 1:
        data["sample"]["rounds"] = rounds
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


def _batch_of(warm: Path, where: Path, stages=("sample", "reward"), rounds: int = 1, **execution) -> dict:
    """The batch files ``stages`` wrote in a copy of ``warm`` run with ``execution`` (see _contents)."""
    shutil.copytree(warm, where)
    (where / "params.yaml").write_text(yaml.safe_dump(_params(rounds, **execution)))
    for name in stages:
        run_stage(name, where)
    return _contents(where)


@pytest.fixture(scope="module")
def local_ws(warm, tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("local") / "ws"
    _batch_of(warm, where, backend="local", shards=1)
    return where


@pytest.fixture(scope="module")
def local_batch(local_ws) -> dict:
    return _contents(local_ws)


def test_evaluate_on_the_default_local_ray_of_this_machine_completes(warm, local_ws, tmp_path):
    """`execution.backend: ray` and nothing else: the stage starts Ray's default local cluster (this
    machine's cores; 2 on the CI machine), whose CPUs the evaluate stage's verifier actors and the
    next policy's sampler actors cannot hold at once. It completes, with the local run's passes.
    (First in the module: the in-process cluster of the tests below must not be up yet.)"""
    import ray

    assert not ray.is_initialized()
    where = tmp_path / "ws"
    shutil.copytree(local_ws, where)
    for name in ("grade", "validate", "train"):
        run_stage(name, where)
    (where / "params.yaml").write_text(yaml.safe_dump(_params(backend="ray")))
    bin_dir = Path(sys.executable).parent
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run([str(bin_dir / "closedloop"), "stage", "evaluate"], cwd=where, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    (where / "params.yaml").write_text(yaml.safe_dump(_params(backend="local")))
    on_ray = read_json(Workspace.at(where).evaluation)
    run_stage("evaluate", where)
    local = read_json(Workspace.at(where).evaluation)
    assert {role: on_ray[role]["per_task"] for role in on_ray} == {role: local[role]["per_task"] for role in local}


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
    _assert_same_batch(_batch_of(warm, tmp_path / "ws", backend="ray", shards=shards, ray={"workers": 2}), local_batch)
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
    _assert_same_batch(batch, local_batch)
    assert len(batch) == 3 if stage == "reward" else len(batch) == 2


def test_a_worker_killed_in_an_episode_s_second_round_is_retried_with_the_same_episodes(warm, ray_cluster, tmp_path,
                                                                                        monkeypatch):
    """sample.rounds 2 on Ray, 3 shards: the sampler worker of shard 1 dies after sampling it in round 2
    (the arrivals before, round 1's sampling and round 2's measuring of the transcripts, pass), the
    shard runs again, and the episodes are those of one local process with no fault."""
    local = _batch_of(warm, tmp_path / "local", stages=("sample",), rounds=2, backend="local", shards=1)
    marker = tmp_path / "killed"
    monkeypatch.setenv("CLOSEDLOOP_FAULT", "shard:SampleWorker:1")
    monkeypatch.setenv("CLOSEDLOOP_FAULT_MARKER", str(marker))
    monkeypatch.setenv("CLOSEDLOOP_FAULT_SKIP", "2")
    batch = _batch_of(warm, tmp_path / "ws", stages=("sample",), rounds=2, backend="ray", shards=3,
                      ray={"workers": 2, "retries": 1})
    assert marker.exists() and Path(f"{marker}.skip1").exists(), "the fault did not fire in a later round"
    _assert_same_batch(batch, local)
    from closedloop.io import read_jsonl

    assert max(s["episode"]["rounds"] for s in read_jsonl(tmp_path / "ws" / "data/batch/samples.jsonl")) > 1


def test_a_worker_lost_more_often_than_retries_allow_fails_the_stage_naming_the_key(warm, ray_cluster, tmp_path,
                                                                                   monkeypatch):
    from closedloop.execution.base import ExecutionError

    monkeypatch.setenv("CLOSEDLOOP_FAULT", "shard:SampleWorker:0")  # no marker: it fires every time
    with pytest.raises(ExecutionError, match="execution.ray.retries"):
        _batch_of(warm, tmp_path / "ws", stages=("sample",), backend="ray", shards=2, ray={"workers": 1, "retries": 0})
    assert not (tmp_path / "ws" / "data/batch/samples.jsonl").exists()  # nothing half-written


def test_an_actor_the_cluster_cannot_place_fails_the_stage_naming_what_it_asked_for(warm, ray_cluster, tmp_path):
    from closedloop.execution.base import ExecutionError

    started = time.monotonic()
    with pytest.raises(ExecutionError, match=r"asking for 64 CPU.*within 3 s.*placement_timeout_s.*4 CPU in all"):
        _batch_of(warm, tmp_path / "ws", stages=("sample",), backend="ray", shards=2,
                  ray={"num_cpus": 64, "placement_timeout_s": 3})
    assert not (tmp_path / "ws" / "data/batch/samples.jsonl").exists()  # nothing half-written
    # The deadline is what the user waits, give or take the stage's start: the actors that were never
    # placed are not asked to close (they cannot run it; that waited 60 s more).
    assert time.monotonic() - started < 45


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
    got = _contents(where)
    assert set(got) == set(local_batch)
    _assert_same_batch(got, local_batch)
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


def test_grpo_rounds_inside_a_ray_task_sample_and_score_on_that_worker(ray_cluster):
    """The train stage runs as a Ray task holding its CPUs; its on-policy rounds must not ask the cluster
    for sampler and sandbox actors that may never fit beside it (a hang), so there they run locally."""
    import ray

    from closedloop.config import parse_params
    from closedloop.stages.onpolicy import executor_params

    params = parse_params({"execution": {"backend": "ray"}}, "test")
    assert executor_params(params).execution.backend == "ray"  # the driver: the cluster serves the rounds

    @ray.remote(num_cpus=1)
    def inside(dumped: dict) -> str:
        return executor_params(parse_params(dumped, "test")).execution.backend

    assert ray.get(inside.remote(params.model_dump(mode="json"))) == "local"
