"""One writer per workspace: the lock a run holds from its first write to its last.

Two runs on one workspace mix their data (one run's experiment saved with the other's tasks, a
model registered twice), so ``closedloop run``, ``closedloop stage`` and every flow hold this lock.
It is an ``flock`` on ``.closedloop/run.lock``: the kernel releases it when the holder dies, however
it dies, so a lock is never left held by a dead process. Its file records who holds it (pid, host,
start time, command, Prefect flow-run id); a record left behind by a holder that died is how a
stale lock shows itself, and the next run takes it over with a warning.

The lock is re-entrant within a process (a CLI run holds it, then its flows and their subflows
take it again), and a child process of the holder (``dvc repro`` calling ``closedloop stage``) is
let through: the holder names itself in ``CLOSEDLOOP_LOCK_HOLDER``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

LOCK_FILE = ".closedloop/run.lock"
HOLDER_ENV = "CLOSEDLOOP_LOCK_HOLDER"  # "<workspace>:<pid>", inherited by the holder's children


class WorkspaceBusy(RuntimeError):
    """Another run holds the workspace; the message names it."""


_held: dict[Path, list] = {}  # workspace -> [file descriptor, depth]
_guard = threading.Lock()


def local_state_dir(root: Path) -> Path:
    """``.closedloop/``: this machine's state of a run (lock, progress, Prefect's database). It ignores
    itself in git, so a workspace made before closedloop kept it there stays clean in `git status`."""
    directory = Path(root).resolve() / ".closedloop"
    directory.mkdir(parents=True, exist_ok=True)
    ignore = directory / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# local run state, not versioned (closedloop/runlock.py)\n*\n")
    return directory


def lock_path(root: Path) -> Path:
    return Path(root).resolve() / LOCK_FILE


def holder(root: Path) -> dict | None:
    """The record of whoever holds (or last held without releasing) the workspace; None if none."""
    try:
        text = lock_path(root).read_text()
    except OSError:
        return None
    try:
        record = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def describe(record: dict) -> str:
    flow_run = f", Prefect flow run {record['flow_run_id']}" if record.get("flow_run_id") else ""
    return (f"pid {record.get('pid')} on {record.get('host')} since {record.get('started')} "
            f"({record.get('command')}{flow_run})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _inherited(root: Path) -> bool:
    """This process is a child of the holder (``dvc repro`` run by a stage that holds the lock)."""
    value = os.environ.get(HOLDER_ENV, "")
    where, _, pid = value.rpartition(":")
    if not where or Path(where) != root or not pid.isdigit():
        return False
    record = holder(root)
    return bool(record) and record.get("pid") == int(pid) and _alive(int(pid))


def _write_record(fd: int, record: dict) -> None:
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


@contextmanager
def workspace_lock(root: Path | str, *, wait: bool = False, command: str = "", flow_run_id: str | None = None,
                   poll_s: float = 2.0, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the workspace for the block. Taken by another live process: ``WorkspaceBusy`` naming it
    at once, or with ``wait`` a wait until it is free (saying so once). ``say`` gets the warnings
    (default: stderr)."""
    say = say or (lambda line: print(f"closedloop: {line}", file=sys.stderr, flush=True))
    root = Path(root).resolve()
    with _guard:
        entry = _held.get(root)
        if entry is not None:
            entry[1] += 1
    if entry is not None or _inherited(root):
        try:
            if entry is not None and flow_run_id:
                annotate(root, flow_run_id=flow_run_id)
            yield
        finally:
            if entry is not None:
                with _guard:
                    entry[1] -= 1
        return
    fd = _acquire(root, wait=wait, poll_s=poll_s, say=say)
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command or " ".join(sys.argv),
                  "flow_run_id": flow_run_id}
        _write_record(fd, record)
        with _guard:
            _held[root] = [fd, 1]
        previous_env = os.environ.get(HOLDER_ENV)
        os.environ[HOLDER_ENV] = f"{root}:{os.getpid()}"
        try:
            yield
        finally:
            if previous_env is None:
                os.environ.pop(HOLDER_ENV, None)
            else:
                os.environ[HOLDER_ENV] = previous_env
    finally:
        with _guard:
            _held.pop(root, None)
        try:
            os.ftruncate(fd, 0)  # released cleanly: no record left to look stale
        finally:
            os.close(fd)  # closing the descriptor releases the flock


def annotate(root: Path | str, **fields) -> None:
    """Add fields (the Prefect flow-run id, once a flow starts) to the record of a lock this process holds."""
    root = Path(root).resolve()
    with _guard:
        entry = _held.get(root)
    if entry is None:
        return
    record = holder(root) or {}
    record.update({key: value for key, value in fields.items() if value is not None})
    _write_record(entry[0], record)


def is_held(root: Path | str) -> bool:
    """Whether a live process holds the workspace now, by its record (taking the flock to look, even
    shared, would make a concurrent run's attempt fail for a moment)."""
    root = Path(root).resolve()
    if root in _held:
        return True
    record = holder(root)
    return bool(record) and record.get("host") == socket.gethostname() and _alive(int(record.get("pid") or 0))


def holds(root: Path | str) -> bool:
    return Path(root).resolve() in _held


def _acquire(root: Path, *, wait: bool, poll_s: float, say: Callable[[str], None]) -> int:
    path = lock_path(root)
    local_state_dir(root)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    announced = False
    patience = time.monotonic() + 2.0
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                record = holder(root) or {}
                if not record and time.monotonic() < patience:
                    time.sleep(0.05)  # the holder took the flock a moment ago and is writing its record
                    continue
                if not wait:
                    raise WorkspaceBusy(
                        f"the workspace {root} is in use by another run: {describe(record)}. Wait for it to "
                        f"finish, or run with --wait to queue behind it"
                    ) from None
                if not announced:
                    say(f"waiting for the workspace {root}: held by {describe(record)}")
                    announced = True
                time.sleep(poll_s)
        left = holder(root)
        if left and left.get("pid") != os.getpid():
            # The kernel let go of a dead holder's flock; its record says who it was.
            pid = int(left.get("pid") or 0)
            state = "no longer running" if not _alive(pid) else "no longer holding it"
            say(f"warning: took over a stale workspace lock: {describe(left)} is {state}; "
                "`closedloop run` resumes what it left unfinished")
        return fd
    except BaseException:
        os.close(fd)
        raise
