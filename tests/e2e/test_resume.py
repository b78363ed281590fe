"""The loop loses nothing: `closedloop run` killed anywhere (SIGKILL to its whole process group) is
finished by the next `closedloop run`, and the workspace, the MLflow store and the registry end up as
an uninterrupted run leaves them. Two runs on one workspace: the second is refused, or queues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli_loop import BIN, REPRODUCIBLE_OUTS, cli, lock_outs

# Where the killed run dies, in the order one iteration reaches them (closedloop/faults.py).
KILL_POINTS = ("stage:sample", "stage:reward", "train:checkpoint", "stage:evaluate", "version:exp-save",
               "version:mlflow-log", "version:register")


def make_workspace(tmp: Path, warm_copy) -> Path:
    """A copy of the warm-started template (tests/conftest.py) that checkpoints after step 1 of 2: a kill
    mid-training. Every kill point is past the warm start (the reference starts from the same copy)."""
    return warm_copy(tmp / "ws", {"train": {"checkpoint_every": 1}})


def start_run(root: Path, *extra: str, fault: str | None = None, api_url: str | None = None) -> subprocess.Popen:
    """`closedloop run -n 1` in its own process group: against the Prefect API at ``api_url`` (the test
    run's server), or without one, as a user runs it, on the workspace's ephemeral API."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.pop("CLOSEDLOOP_FAULT", None)
    if fault:
        env["CLOSEDLOOP_FAULT"] = fault
        env["CLOSEDLOOP_FAULT_DELAY_S"] = "0.3"
    return subprocess.Popen([str(BIN / "closedloop"), "run", "-n", "1", "--no-progress", *extra], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(process: subprocess.Popen, timeout: float = 900) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def stores(root: Path) -> dict:
    """What the test compares: the batch and model hashes, experiments, registry, runs, git and DVC."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("closedloop")
    runs = client.search_runs([experiment.experiment_id])
    versions = client.search_model_versions("name = 'closedloop-policy'")
    model = client.get_registered_model("closedloop-policy")
    git = lambda *args: subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout  # noqa: E731
    exps = sorted(line.rsplit("/", 1)[-1] for line in git("for-each-ref", "--format=%(refname)", "refs/exps").split()
                  if line.count("/") == 4)
    return {
        "outs": {path: md5 for path, md5 in lock_outs(root).items() if path in (*REPRODUCIBLE_OUTS, "data/models/candidate")},
        "experiments": exps,
        # which of DVC's executor refs exist (EXEC_HEAD stays after every save; its commit differs)
        "exec_refs": git("for-each-ref", "--format=%(refname)", "refs/exps/exec").split(),
        "finished_runs": sorted(r.info.run_name for r in runs if r.info.status == "FINISHED"),
        "running_runs": [r.info.run_name for r in runs if r.info.status == "RUNNING"],
        "killed_runs": sorted(r.info.run_name for r in runs if r.info.status == "KILLED"),
        "versions": sorted((v.tags.get("iteration"), v.tags.get("model.fingerprint")) for v in versions),
        "aliases": dict(model.aliases),
        "git_status": sorted(line[3:] for line in git("status", "--porcelain").splitlines()),
        "git_index": git("diff", "--cached", "--name-only"),
        "iteration": yaml.safe_load((root / "params.yaml").read_text())["loop"]["iteration"],
    }


@pytest.fixture(scope="module")
def reference(prefect_api, warm_copy, tmp_path_factory):
    root = make_workspace(tmp_path_factory.mktemp("uninterrupted"), warm_copy)
    code, out, err = finish(start_run(root, api_url=prefect_api))
    assert code == 0, err[-3000:]
    return root


def test_a_run_killed_anywhere_is_finished_by_the_next_run(reference, prefect_api, warm_copy, tmp_path):
    root = make_workspace(tmp_path, warm_copy)
    for point in KILL_POINTS:
        # The first kill also ends the workspace's own ephemeral Prefect server mid-run, and the run that
        # finishes starts it again on that database; the kills between run on the test run's server.
        api_url = None if point == KILL_POINTS[0] else prefect_api
        code, out, err = finish(start_run(root, fault=point, api_url=api_url))
        assert code == -signal.SIGKILL, f"{point}: exited {code}, not killed\n{err[-3000:]}"
        progress = json.loads((root / ".closedloop/iteration.json").read_text())
        assert progress["iteration"] == 1 and progress["state"] == "running", (point, progress)
        # the number is never skipped: params.yaml names iteration 1 throughout
        assert yaml.safe_load((root / "params.yaml").read_text())["loop"]["iteration"] == 1, point
    code, out, err = finish(start_run(root))
    assert code == 0, err[-3000:]
    assert "iteration 1 " in out and "resuming iteration 1" in out + err, out + err
    assert "already done" in out + err  # the last run did only what the killed ones left
    finished, expected = stores(root), stores(reference)
    # the runs the kills cut short end KILLED under their own name; otherwise the stores are the same
    assert finished.pop("killed_runs") == ["iteration-001-interrupted"] and not expected.pop("killed_runs")
    assert finished == expected
    assert json.loads((root / ".closedloop/iteration.json").read_text())["state"] == "done"
    assert cli("dvc", "status", cwd=root).stdout.strip().endswith("up to date.")
    assert not (root / "data/models/candidate.checkpoint").exists()


def wait_for_holder(root: Path, process: subprocess.Popen, timeout: float = 120) -> dict:
    lock = root / ".closedloop/run.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the first run ended before holding the lock: {process.communicate()}")
        text = lock.read_text() if lock.exists() else ""
        if text.strip() and json.loads(text).get("pid") == process.pid:
            return json.loads(text)
        time.sleep(0.2)
    raise AssertionError("the first run never took the workspace lock")


def test_a_second_run_is_refused_naming_the_holder_or_queues_with_wait(reference, prefect_api):
    root = reference
    first = start_run(root, api_url=prefect_api)
    holder = wait_for_holder(root, first)
    started = time.monotonic()
    refused = subprocess.run([str(BIN / "closedloop"), "run", "-n", "1"], cwd=root, capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    assert refused.returncode == 75, refused.stderr
    assert f"pid {holder['pid']}" in refused.stderr and "--wait" in refused.stderr
    assert time.monotonic() - started < 30  # refused at once, not after the first run
    queued = start_run(root, "--wait", api_url=prefect_api)
    code, _, err = finish(first)
    assert code == 0, err[-3000:]
    code, out, err = finish(queued)
    assert code == 0, err[-3000:]
    assert "waiting for the workspace" in err and "iteration 3 " in out, out + err
    after = stores(root)
    # as if they ran one after the other: iterations 2 and 3, one experiment and one version each
    assert after["iteration"] == 3
    assert [name[:8] for name in after["experiments"]] == ["iter-001", "iter-002", "iter-003"]
    assert [iteration for iteration, _ in after["versions"]].count("2") <= 1
    assert [iteration for iteration, _ in after["versions"]].count("3") <= 1
    assert not after["running_runs"]


def test_a_deleted_benchmark_file_is_named_before_any_stage_and_the_run_resumes_once_restored(reference, prefect_api):
    root = reference
    n = yaml.safe_load((root / "params.yaml").read_text())["loop"]["iteration"] + 1
    benchmark = root / "data/benchmark/tasks.jsonl"
    benchmark.unlink()
    started = time.monotonic()
    code, out, err = finish(start_run(root, api_url=prefect_api))
    assert code == 1 and "data/benchmark/tasks.jsonl" in err and "pre-flight" in err, err[-3000:]
    assert time.monotonic() - started < 120  # before any stage, not after a whole iteration
    progress = json.loads((root / ".closedloop/iteration.json").read_text())
    assert progress["iteration"] == n and progress["stage"] == "preflight" and not progress["completed"]
    cli("dvc", "checkout", "data/benchmark/tasks.jsonl", cwd=root)
    code, out, err = finish(start_run(root, api_url=prefect_api))
    assert code == 0 and f"resuming iteration {n}" in err and f"iteration {n} " in out, out + err[-3000:]


def test_an_unreachable_tracking_store_fails_before_any_work_naming_the_uri(reference):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    root = reference
    n = yaml.safe_load((root / "params.yaml").read_text())["loop"]["iteration"] + 1
    env_run = subprocess.run([str(BIN / "closedloop"), "run", "-n", "1", "--no-progress"], cwd=root,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                  "MLFLOW_TRACKING_URI": uri})
    assert env_run.returncode == 1 and uri in env_run.stderr and "MLFLOW_TRACKING_URI" in env_run.stderr, \
        env_run.stderr[-3000:]
    # the iteration begun and stopped before any stage: the number the next run resumes
    assert yaml.safe_load((root / "params.yaml").read_text())["loop"]["iteration"] == n
    assert json.loads((root / ".closedloop/iteration.json").read_text())["completed"] == {}
