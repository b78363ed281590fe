"""The sandbox worker: a small, long-lived, stdlib-only interpreter that runs each job in a forked child.

Started by pool.py as ``python -s -S -B worker.py <scratch dir>`` with a minimal environment. It must
import nothing but the stdlib (never closedloop, never torch): forking a small interpreter costs
~1.5 ms, forking one that has torch loaded ~25 ms.

Protocol on the worker's stdin/stdout (moved to private fds at start, so stray prints cannot corrupt
it): frames of a 4-byte big-endian length followed by UTF-8 JSON.
  request  {"program", "entry_point", "calls", "limits": {"timeout_s", "memory_mb", "max_output_bytes"}}
  reply    {"status", "outputs": [[ok, value, error], ...], "error", "stdout", "stderr", "exit_code", "wall_s"}

Per job the worker forks a child that starts a new session, chdirs into a fresh empty directory,
sets rlimits, redirects stdout/stderr to capped files, compiles and runs the program, calls the entry
point once per args list and streams its result back over a pipe. The worker enforces the wall
clock, kills the child's whole process group, and maps how the child ended to a status.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == _HERE:
    # Python puts the script's folder first on sys.path; drop it so the sandboxed program cannot
    # import closedloop's modules (child.py is loaded by explicit path below instead).
    del sys.path[0]

import importlib.util
import json
import select
import shutil
import signal
import struct
import time


def _load_child():
    spec = importlib.util.spec_from_file_location("_closedloop_sandbox_child", os.path.join(_HERE, "child.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_child()
_HEADER = struct.Struct(">I")


# ---------------------------------------------------------------------------------------------
# The worker side of one job


def _wait_child(pid, result_r, deadline, cap):
    """Collect the child's result bytes until it exits or the deadline passes.

    Returns (data, exited, overflow). Uses a pidfd where the kernel has one, else short polls.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    data = bytearray()
    open_fds = [result_r] + ([pidfd] if pidfd is not None else [])
    exited = overflow = False
    try:
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = remaining if pidfd is not None else min(remaining, 0.002)
            ready, _, _ = select.select(open_fds, [], [], wait)
            if result_r in ready:
                chunk = os.read(result_r, 65536)
                if chunk:
                    data += chunk
                    if len(data) > cap:
                        overflow = True
                        break
                else:
                    open_fds.remove(result_r)
            if pidfd is not None:
                exited = pidfd in ready
            else:
                exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return data, exited, overflow


def _kill_group(pid):
    # The child leads its own process group; until it is reaped its (zombie) entry keeps the group
    # id from being reused, so this cannot hit an unrelated process.
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _drain(result_r, data, cap):
    """Read what the child left in the pipe; stragglers of its group were killed just before."""
    deadline = time.monotonic() + 0.5
    while len(data) <= cap and time.monotonic() < deadline:
        ready, _, _ = select.select([result_r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(result_r, 65536)
        if not chunk:
            break
        data += chunk


def _final_line(data, n_calls):
    """The child's last complete line, validated; None if it wrote none or a malformed one."""
    lines = bytes(data).split(b"\n")[:-1]  # an unterminated last piece is an interrupted write
    if not lines or lines[-1] in (b"ready", b"loaded"):
        return None
    try:
        result = json.loads(lines[-1])
        status, outputs, error = result["status"], result["outputs"], result["error"]
        shaped = all(type(o) is list and len(o) == 3 and type(o[0]) is bool and type(o[2]) is str for o in outputs)
        if status == "ok" and (len(outputs) != n_calls or not shaped):
            return None
        if status not in ("ok", "syntax_error", "load_error", "memory", "output_limit") or type(error) is not str:
            return None
        return result
    except (ValueError, KeyError, TypeError):
        return None


def _classify(data, exit_code, timed_out, overflow, limits, n_calls):
    """(status, error, outputs) from how the child ended and what it wrote."""
    if timed_out:
        return "timeout", f"timed out after {limits['timeout_s']}s", []
    if overflow:
        return "output_limit", f"result pipe exceeded {limits['max_output_bytes']} bytes", []
    if exit_code == -signal.SIGXFSZ:
        return "output_limit", f"output exceeded {limits['max_output_bytes']} bytes", []
    if exit_code == -signal.SIGXCPU:
        return "timeout", f"CPU time limit exceeded ({limits['timeout_s']}s)", []
    if not data.startswith(b"ready\n"):
        # The child died before the program ran (the program cannot suppress this marker).
        return "infra_error", f"sandbox setup failed in the job process (exit code {exit_code})", []
    result = _final_line(data, n_calls) if exit_code == 0 else None
    if result is not None:
        return result["status"], result["error"], result["outputs"]
    loaded = b"\nloaded\n" in data
    how = f"was killed by signal {_signal_name(-exit_code)}" if exit_code < 0 else f"exited with code {exit_code}"
    if not loaded:
        return "load_error", f"process {how} while loading the program", []
    return "killed", f"process {how} before returning from every call", []


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _read_capped(fd, cap):
    return os.pread(fd, cap, 0).decode("utf-8", errors="replace")


def _rewind(fd):
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)


def run_job(request, scratch, number, out_fd, err_fd):
    """Run one job in a forked child; returns the reply dict. Raises only on worker-side failures.

    ``out_fd``/``err_fd`` are the worker's capture files, reused (truncated) for every job.
    """
    limits = request["limits"]
    cap = limits["max_output_bytes"]
    workdir = os.path.join(scratch, f"job{number}")
    os.mkdir(workdir, 0o700)  # fresh and empty for every job
    _rewind(out_fd)
    _rewind(err_fd)
    result_r, result_w = os.pipe()
    try:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child.run_child(request, result_w, out_fd, err_fd, workdir)  # never returns
        os.close(result_w)
        result_w = -1
        data, exited, overflow = _wait_child(pid, result_r, start + limits["timeout_s"], cap + 4096)
        wall = time.monotonic() - start
        _kill_group(pid)
        if exited and not overflow:
            _drain(result_r, data, cap + 4096)
        _, status = os.waitpid(pid, 0)
        exit_code = os.waitstatus_to_exitcode(status)
        timed_out = not exited and not overflow
        state, error, outputs = _classify(data, exit_code, timed_out, overflow, limits, len(request["calls"]))
        return {
            "status": state,
            "outputs": outputs,
            "error": error,
            "stdout": _read_capped(out_fd, cap),
            "stderr": _read_capped(err_fd, cap),
            "exit_code": exit_code,
            "wall_s": round(wall, 6),
        }
    finally:
        for fd in (result_r, result_w):
            if fd >= 0:
                os.close(fd)
        try:
            os.rmdir(workdir)  # the common case: the program wrote no files
        except OSError:
            shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The worker's loop


def _read_exact(fd, size):
    chunks, need = [], size
    while need:
        chunk = os.read(fd, need)
        if not chunk:
            return None
        chunks.append(chunk)
        need -= len(chunk)
    return b"".join(chunks)


def main(argv):
    scratch = argv[1]
    # Move the protocol pipes off 0/1 so nothing else in this process can write into the protocol.
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    # Ctrl-C in a terminal reaches the whole foreground group; the pool decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
    out_fd = os.open(os.path.join(scratch, "stdout"), flags, 0o600)
    err_fd = os.open(os.path.join(scratch, "stderr"), flags, 0o600)
    child.warm_up()
    number = 0
    while True:
        header = _read_exact(proto_in, _HEADER.size)
        if header is None:
            return 0  # the pool closed our stdin: shut down
        body = _read_exact(proto_in, _HEADER.unpack(header)[0])
        if body is None:
            return 0
        number += 1
        try:
            reply = run_job(json.loads(body), scratch, number, out_fd, err_fd)
        except Exception as exc:  # noqa: BLE001 - the pool must get an answer for every request
            reply = {"status": "infra_error", "outputs": [], "error": f"worker: {child.describe(exc)}",
                     "stdout": "", "stderr": "", "exit_code": None, "wall_s": 0.0}
        payload = json.dumps(reply).encode()  # ASCII escapes carry any str, lone surrogates included
        child.write_all(proto_out, _HEADER.pack(len(payload)) + payload)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
