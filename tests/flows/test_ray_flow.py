"""The flows on a real local Ray cluster through prefect-ray's RayTaskRunner (execution.backend ray),
against a real Prefect API: the warm start and one iteration give the batch the local flow gives,
DVC is clean afterwards, and each stage task ran in a Ray worker process and was recorded in the
flow's Prefect API from there; a task on Ray talks to the flow's ephemeral API when there is no
PREFECT_API_URL. One `ray start` head for the module (~10-20 s), the two loops ~2-3 min on 2 cores."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from closedloop.lineage.dvc import DvcWorkspace
from closedloop.pipeline import ITERATION_STAGES, WARM_START_STAGES

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("prefect_api")]

BATCH = ("data/batch/samples.jsonl", "data/batch/rewards.jsonl")
EXECUTION = {"shards": 2, "ray": {"workers": 2}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _processes_under(marker: str) -> list[int]:
    """Ids of the processes whose command line names ``marker`` (this cluster's own temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head of 4 logical CPUs (a stage task beside its 2 actors) started by `ray start --block`
    in a temp dir of its own; stopped by ending only its processes (`ray stop` would end every Ray
    cluster on the machine, other people's too)."""
    temp = Path(tempfile.mkdtemp(prefix="clray-", dir="/tmp"))
    port = _free_port()
    # On loopback only. Ray 2.60's `ray start` turns token authentication on where ~/.ray/auth_token
    # exists, and a driver joining by address is then refused unless it runs with RAY_AUTH_MODE=token.
    env = {**{key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}, "RAY_AUTH_MODE": "disabled"}
    ray_bin = Path(sys.executable).parent / "ray"
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--num-cpus=4", "--num-gpus=0", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        cwd=temp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(temp.glob("session_*/sockets/raylet*")):
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`ray start --head` did not come up (exit {head.poll()}); logs in {temp}")
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "temp": temp}
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        for pid in _processes_under(str(temp)):  # anything of this cluster still alive
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def _new_workspace(root: Path, backend: str, **execution) -> Path:
    from closedloop.scaffold import init_workspace
    from tests.conftest import TINY

    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump({**TINY, "execution": {"backend": backend, **execution}}))
    init_workspace(root)
    return root


def _hashes(root: Path) -> dict[str, str]:
    return {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in BATCH}


RAY_RUN_TAG = "ray-flow-test"


def _task_runs(tag: str) -> dict[str, str]:
    """Task name → state of each task run the Prefect API holds with this tag."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterTags

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=[tag])))
    return {run.name.rsplit("-", 1)[0]: run.state_type.value for run in runs}


@pytest.fixture(scope="module")
def runs(ray_head, prefect_api, tmp_path_factory):
    """The warm start and one iteration by the loop flow, on Ray and locally, in two workspaces made
    identically. The local flow gets one torch thread, as a Ray task of 1 CPU does (Ray sets
    OMP_NUM_THREADS): the warm start's training depends on the thread count."""
    import torch
    from prefect import tags

    from flows.loop import closed_loop

    base = tmp_path_factory.mktemp("rayflow")
    on_ray = _new_workspace(base / "on-ray", "ray", **{**EXECUTION, "ray": {**EXECUTION["ray"],
                                                                             "address": ray_head["address"]}})
    local = _new_workspace(base / "local", "local", **EXECUTION)
    figures = {}
    started = time.perf_counter()
    with tags(RAY_RUN_TAG):  # the task runs inherit it, also those recorded from Ray workers
        ray_result = closed_loop(iterations=1, workspace=str(on_ray))
    figures["ray_seconds"] = time.perf_counter() - started
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        started = time.perf_counter()
        local_result = closed_loop(iterations=1, workspace=str(local))
        figures["local_seconds"] = time.perf_counter() - started
    finally:
        torch.set_num_threads(threads)
    print(f"closed_loop(iterations=1): ray {figures['ray_seconds']:.1f} s, local {figures['local_seconds']:.1f} s")
    for name, result in (("ray", ray_result), ("local", local_result)):
        stage_s = result["iterations"][0]["timing"]["task"]
        print(f"  {name} iteration stage tasks (s): " + ", ".join(f"{k} {v:.1f}" for k, v in stage_s.items()))
    return {"ray": (on_ray, ray_result), "local": (local, local_result), **figures}


def test_the_ray_flow_gives_the_batch_the_local_flow_gives(runs):
    (on_ray, ray_result), (local, local_result) = runs["ray"], runs["local"]
    assert ray_result["iterations"][0]["iteration"] == local_result["iterations"][0]["iteration"] == 1
    assert _hashes(on_ray) == _hashes(local)


def test_dvc_is_clean_after_the_ray_flow(runs):
    on_ray, _ = runs["ray"]
    assert DvcWorkspace(on_ray).status() == {}


def test_every_stage_task_ran_in_a_ray_worker_and_reported_to_the_flow_s_api(runs, ray_head):
    """Ray's own worker logs (one file per worker process, named by its pid, each task it ran marked
    ``:task_name:<name>``) hold every stage task, in processes other than this one; and the Prefect
    API the flows ran against holds each stage's task run, Completed, recorded from those workers.
    (The harness's URL is an explicit setting, which prefect-ray's serialised context carries too;
    the ephemeral API's URL is not: see the probe test below.)"""
    expected = set(WARM_START_STAGES) | set(ITERATION_STAGES)
    ran_in: dict[str, set[int]] = {}
    for log in ray_head["temp"].glob("session_*/logs/worker-*.out"):
        pid = int(re.search(r"-(\d+)\.out$", log.name).group(1))
        for name in re.findall(r"^:task_name:(\S+)$", log.read_text(errors="replace"), re.M):
            ran_in.setdefault(name, set()).add(pid)
    missing = expected - set(ran_in)
    assert not missing, f"no Ray worker ran the stage task(s) {sorted(missing)}; seen: {sorted(ran_in)}"
    assert all(os.getpid() not in pids for name, pids in ran_in.items() if name in expected)

    deadline = time.monotonic() + 60
    while True:  # task runs reach the API as events: the last ones may still be on their way
        states = {name: _task_runs(RAY_RUN_TAG).get(name) for name in expected}
        if all(state == "COMPLETED" for state in states.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states == {name: "COMPLETED" for name in expected}



PROBE = """
import json, os, sys, time

from prefect import flow, task
from prefect.exceptions import ObjectNotFound

from closedloop.config import parse_params
from flows.ray_runner import prefect_api_url, ray_task_runner


@task(name="probe", persist_result=False)
def probe():
    from prefect.client.orchestration import get_client
    from prefect.runtime import task_run

    with get_client(sync_client=True) as client:
        return {"pid": os.getpid(), "api": str(client.api_url).rstrip("/"), "task_run_id": str(task_run.id)}


@flow
def probing(address: str) -> dict:
    from prefect.client.orchestration import get_client

    params = parse_params({"execution": {"backend": "ray", "ray": {"address": address}}})
    with ray_task_runner(params) as runner:
        seen = runner.submit(probe, {}).result()
    # Task runs reach the API as events, written in batches: under load that takes longer, so the
    # wait is a minute per core's worth of load, read again at every poll (a load that rises during
    # the wait lengthens it: a fresh-clone run sampled a quiet moment and gave up after 60 s), at
    # least three minutes and at most five. It ends as soon as the state is there.
    def limit() -> float:
        return 60 * min(5.0, max(3.0, os.getloadavg()[0] / (os.cpu_count() or 1)))

    state, started = None, time.monotonic()
    with get_client(sync_client=True) as client:
        while state != "COMPLETED" and time.monotonic() - started < limit():
            try:
                state = client.read_task_run(seen["task_run_id"]).state_type.value
            except ObjectNotFound:
                pass
            time.sleep(0.5)
    return {**seen, "flow_pid": os.getpid(), "flow_api": prefect_api_url(), "state": state}


print("RESULT " + json.dumps(probing(sys.argv[1])))
"""


def test_a_task_on_ray_talks_to_the_flow_s_ephemeral_prefect_api(ray_head, tmp_path):
    """Without PREFECT_API_URL (what `closedloop run` does with no server) Prefect starts an API server
    for the flow process, whose URL is in no setting: the runner hands it to the workers. (Without it,
    a worker started an API server of its own on the same database.)"""
    import json

    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    home = tmp_path / "prefect"
    env = {key: value for key, value in os.environ.items() if key not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home / 'prefect.db'}")
    done = subprocess.run([sys.executable, str(script), ray_head["address"]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    seen = json.loads(lines[-1].removeprefix("RESULT "))
    assert seen["pid"] != seen["flow_pid"]  # the task ran in a Ray worker
    assert seen["flow_api"].startswith("http://127.0.0.1:") and seen["api"] == seen["flow_api"]
    assert seen["state"] == "COMPLETED"
