"""The workspace lock: one writer, a second refused naming the first, --wait queues, stale taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from closedloop.runlock import HOLDER_ENV, WorkspaceBusy, holder, holds, is_held, workspace_lock

HOLD = """
import sys, time
from closedloop.runlock import workspace_lock
with workspace_lock(sys.argv[1], command="test holder", flow_run_id="flow-123"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold_in_child(root: Path, seconds: float) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(root), str(seconds)], stdout=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items() if k != HOLDER_ENV})
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    child = hold_in_child(tmp_path, 30)
    try:
        with pytest.raises(WorkspaceBusy) as refused:
            with workspace_lock(tmp_path):
                pass
        message = str(refused.value)
        assert f"pid {child.pid}" in message and "test holder" in message and "flow-123" in message
        assert "--wait" in message
        assert is_held(tmp_path)
    finally:
        child.kill()
        child.wait()
    assert not is_held(tmp_path)  # the kernel let go with the process


def test_wait_queues_behind_the_holder(tmp_path):
    child = hold_in_child(tmp_path, 1.5)
    said: list[str] = []
    started = time.monotonic()
    with workspace_lock(tmp_path, wait=True, poll_s=0.1, say=said.append):
        waited = time.monotonic() - started
        assert holder(tmp_path)["pid"] == os.getpid()
    child.wait()
    assert waited >= 0.5 and said and f"pid {child.pid}" in said[0]


def test_a_dead_holder_is_taken_over_with_a_warning(tmp_path):
    child = hold_in_child(tmp_path, 30)
    os.kill(child.pid, signal.SIGKILL)  # no cleanup runs: the record stays behind, the flock goes
    child.wait()
    said: list[str] = []
    with workspace_lock(tmp_path, say=said.append):
        pass
    assert len(said) == 1 and "stale" in said[0] and f"pid {child.pid}" in said[0] and "no longer running" in said[0]
    assert holder(tmp_path) is None  # released cleanly: nothing left that looks stale


def test_re_entrant_in_a_process_and_open_to_the_holders_children(tmp_path):
    with workspace_lock(tmp_path, command="outer"):
        with workspace_lock(tmp_path, flow_run_id="inner-flow"):  # a subflow takes it again
            assert holds(tmp_path)
        assert holder(tmp_path)["flow_run_id"] == "inner-flow"
        # `dvc repro` run by the holder calls `closedloop stage`: a child of the holder gets through
        child = subprocess.run([sys.executable, "-c", "import sys\nfrom closedloop.runlock import workspace_lock\n"
                                f"with workspace_lock({str(tmp_path)!r}): print('in')"],
                               capture_output=True, text=True)
        assert child.returncode == 0 and child.stdout.strip() == "in", child.stderr
        assert json.loads((tmp_path / ".closedloop/run.lock").read_text())["command"] == "outer"
    assert not holds(tmp_path)
    # an unrelated process (no inherited holder) is refused while someone holds it
    other = hold_in_child(tmp_path, 30)
    try:
        unrelated = subprocess.run([sys.executable, "-c", "from closedloop.runlock import workspace_lock\n"
                                    f"with workspace_lock({str(tmp_path)!r}): pass"], capture_output=True, text=True,
                                   env={**os.environ, HOLDER_ENV: f"{tmp_path}:{os.getpid()}"})
        assert unrelated.returncode != 0 and "WorkspaceBusy" in unrelated.stderr
    finally:
        other.kill()
        other.wait()
