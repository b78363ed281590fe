"""The sandbox worker: a small, long-lived, stdlib-only interpreter that runs each job in a forked child.

Started by pool.py as ``python -s -S -B worker.py <scratch dir> <config json>``, inside bubblewrap
where available, with a minimal environment. It imports nothing but the stdlib and the modules the
pool asks it to preload (never closedloop, never torch): forking a small interpreter costs ~1 ms.

Protocol on the worker's stdin/stdout (moved to private fds at start, so stray prints cannot corrupt
it): frames of a 4-byte big-endian length followed by UTF-8 JSON.
  hello    {"hello": {"measures": [...], "preloaded": [...], "unavailable": {module: error}}} once, after start-up
  request  {"program", "entry_point", "calls", "limits", "files", "allow_exec", "interactive", "collect_files"}
  reply    {"status", "outputs": [[ok, value, error], ...], "error", "stdout", "stderr", "exit_code",
            "wall_s", "cpu_s", "peak_memory_kb", "files"}
"files" is the job directory's tree ({relative path: text}) the child reported with its ok result when
the request asked to collect files, else null. An empty entry point runs the program as a script.
Interactive jobs (the trusted grader makes the calls one at a time) are a session instead:
  worker → {"loaded", "prefetched": outcomes of the request's calls or null, "ended"}; then per pool frame {"call": args} → {"outcome": [ok, value, error]}
  or {"ended": true} once the job is over; pool {"end": true} → the reply above.

Per job the worker forks a child that starts a new session, chdirs into a fresh directory, confines
itself (jail.py: rlimits, an unprivileged uid, seccomp) and runs the program. The worker enforces the
wall clock, kills the child's process group and every orphan it left (the worker is a subreaper),
and maps how the child ended to a status.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == _HERE:
    # Python puts the script's folder first on sys.path; drop it so the sandboxed program cannot
    # import closedloop's modules (child.py and jail.py are loaded by explicit path below instead).
    del sys.path[0]

import importlib
import importlib.util
import json
import select
import shutil
import signal
import struct
import time


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_closedloop_sandbox_{name}", os.path.join(_HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load("child")
jail = _load("jail")
_HEADER = struct.Struct(">I")
_RESULT_SLACK = 4096  # bytes of result-pipe framing allowed beyond the output cap


class _Job:
    """One forked job process and the worker's ends of its pipes."""

    def __init__(self, request, workdir, capture, null, measures):
        self.limits = request["limits"]
        self.request_calls = len(request["calls"]) if request.get("interactive") else 0
        self.cap = self.limits["max_output_bytes"] + _RESULT_SLACK
        result_r, result_w = os.pipe()
        call_r, call_w = os.pipe() if request.get("interactive") else (None, None)
        self.start = time.monotonic()
        self.deadline = self.start + self.limits["timeout_s"]
        fds = {0: null, 1: capture[0], 2: capture[1], child.RESULT_FD: result_w}
        if call_r is not None:
            fds[child.CALL_FD] = call_r
        self.pid = os.fork()
        if self.pid == 0:
            child.run_child(request, fds, workdir, jail, measures)  # never returns
        for fd in (result_w, call_r):
            if fd is not None:
                os.close(fd)
        self.result_r, self.call_w = result_r, call_w
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None
        self.data = bytearray()  # everything the child wrote on the result pipe
        self.read_to = 0  # how much of it interactive reading has consumed
        self.exited = self.overflow = self.timed_out = False

    def _has_exited(self):
        if self.pidfd is not None:
            return bool(select.select([self.pidfd], [], [], 0)[0])
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def pump(self, until):
        """Read the result pipe until ``until(data)`` holds, the child exits, overflows or times out.

        Returns True when ``until`` held.
        """
        watched = [self.result_r] + ([self.pidfd] if self.pidfd is not None else [])
        while not until(self.data):
            if self.exited or self.overflow or self.timed_out:
                return False
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                return False
            wait = remaining if self.pidfd is not None else min(remaining, 0.002)
            ready, _, _ = select.select(watched, [], [], wait)
            if self.result_r in ready:
                chunk = os.read(self.result_r, 65536)
                if chunk:
                    self.data += chunk
                    if len(self.data) > self.cap + self.read_to:
                        self.overflow = True
                    continue
                watched.remove(self.result_r)
            if self.pidfd is None or self.pidfd in ready or self.result_r not in watched:
                self.exited = self._has_exited()
        return True

    def next_line(self):
        """The next complete line the child wrote after what was read already, or None."""
        end = self.data.find(b"\n", self.read_to)
        if end < 0:
            return None
        line = bytes(self.data[self.read_to:end])
        self.read_to = end + 1
        return line

    def finish(self):
        """Kill what is left of the job and reap it; returns (wall_s, exit_code, cpu_s, peak_kb)."""
        wall = time.monotonic() - self.start
        if self.call_w is not None:
            os.close(self.call_w)
            self.call_w = None
        _kill_group(self.pid)
        if self.exited and not self.overflow:
            _drain(self.result_r, self.data, self.cap)
        _, status, usage = os.wait4(self.pid, 0)
        _kill_orphans()
        for fd in (self.result_r, self.pidfd):
            if fd is not None:
                os.close(fd)
        cpu = usage.ru_utime + usage.ru_stime
        return round(wall, 6), os.waitstatus_to_exitcode(status), round(cpu, 6), int(usage.ru_maxrss)


def _kill_group(pid):
    # The child leads its own process group; until it is reaped its (zombie) entry keeps the group
    # id from being reused, so this cannot hit an unrelated process.
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _children():
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as handle:
            return [int(pid) for pid in handle.read().split()]
    except OSError:
        return []


def _has_children():
    """Whether the worker has any child, running or not; cheaper than listing them (waitid, no /proc)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _kill_orphans():
    """Kill and reap every process a job left behind (setsid'd sleepers, daemons).

    The worker is a child subreaper, so orphans of a job become its children instead of init's; a
    job's process tree is gone once the worker has no children left. Bounded: RLIMIT_NPROC caps how
    many a job can have made.
    """
    if not _has_children():  # the usual case, once the job process itself is reaped
        return
    for _ in range(1000):
        pids = _children()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
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


def _is_tree(files):
    return type(files) is dict and all(type(k) is str and type(v) is str for k, v in files.items())


def _final_line(data, n_calls, collect_files=False):
    """The child's last complete line, validated; None if it wrote none or a malformed one.

    Whatever the program forged on the result pipe can only claim values it could have returned, a
    file tree it could have written, or a failure status: never infra_error (which would take the
    job out of the count).
    """
    lines = bytes(data).split(b"\n")[:-1]  # an unterminated last piece is an interrupted write
    if not lines or lines[-1] in (b"ready", b"loaded"):
        return None
    try:
        result = json.loads(lines[-1])
        status, outputs, error = result["status"], result["outputs"], result["error"]
        shaped = all(type(o) is list and len(o) == 3 and type(o[0]) is bool and type(o[2]) is str for o in outputs)
        if status == "ok" and (len(outputs) != n_calls or not shaped):
            return None
        if status == "ok" and collect_files and not _is_tree(result.get("files")):
            return None
        if status not in ("ok", "syntax_error", "load_error", "memory", "output_limit") or type(error) is not str:
            return None
        return result
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _classify(job, exit_code, n_calls, collect_files=False, output_full=False):
    """(status, error, outputs, files) from how the child ended and what it wrote.

    A job that hit a limit fails with that limit's status even when it went on to return: a program
    that catches the failed fork, or ignores SIGXFSZ and the failed writes, must not pass.
    ``output_full``: stdout or stderr reached the cap (a write past it failed).
    """
    limits, data = job.limits, job.data
    if job.timed_out:
        return "timeout", f"timed out after {limits['timeout_s']}s", [], None
    if job.overflow:
        return "output_limit", f"result pipe exceeded {limits['max_output_bytes']} bytes", [], None
    if exit_code == -signal.SIGXFSZ:
        return "output_limit", f"output exceeded {limits['max_output_bytes']} bytes", [], None
    if exit_code == -signal.SIGXCPU:
        return "timeout", f"CPU time limit exceeded ({limits['timeout_s']}s)", [], None
    if b"\n" + child.PROCESS_LIMIT_MARKER in data:
        return ("process_limit", f"hit the process limit ({limits['processes']} processes and threads): "
                "a fork or thread start failed", [], None)
    if output_full:
        return "output_limit", f"output reached the {limits['max_output_bytes']}-byte cap (writes past it failed)", [], None
    if not data.startswith(b"ready\n"):
        # The child died before the program ran (the program cannot suppress this marker).
        return "infra_error", f"sandbox setup failed in the job process (exit code {exit_code})", [], None
    result = _final_line(data, n_calls, collect_files) if exit_code == 0 else None
    if result is not None:
        files = result.get("files") if collect_files and result["status"] == "ok" else None
        return result["status"], result["error"], result["outputs"], files
    loaded = b"\nloaded\n" in data
    how = f"was killed by signal {_signal_name(-exit_code)}" if exit_code < 0 else f"exited with code {exit_code}"
    if not loaded:
        return "load_error", f"process {how} while loading the program", [], None
    return "killed", f"process {how} before returning from every call", [], None


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


class Worker:
    def __init__(self, scratch, proto_in, proto_out, measures):
        self.scratch, self.proto_in, self.proto_out, self.measures = scratch, proto_in, proto_out, measures
        self.inbox = bytearray()
        self.number = 0
        # Memory-backed capture files: reachable by the job only through its fds 1 and 2, never by path.
        self.capture = (os.memfd_create("stdout"), os.memfd_create("stderr"))
        self.null = os.open(os.devnull, os.O_RDONLY)  # every job's stdin

    # -- the pool channel ------------------------------------------------------------------------

    def send(self, message):
        payload = json.dumps(message).encode()  # ASCII escapes carry any str, lone surrogates included
        child.write_all(self.proto_out, _HEADER.pack(len(payload)) + payload)

    def receive(self, deadline=None):
        """The next frame from the pool; None at EOF, "timeout" if ``deadline`` passes first."""
        while True:
            if len(self.inbox) >= _HEADER.size:
                size = _HEADER.unpack_from(self.inbox)[0]
                if len(self.inbox) >= _HEADER.size + size:
                    body = bytes(self.inbox[_HEADER.size:_HEADER.size + size])
                    del self.inbox[:_HEADER.size + size]
                    return json.loads(body)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self.proto_in], [], [], remaining)[0]:
                    return "timeout"
            chunk = os.read(self.proto_in, 1 << 16)
            if not chunk:
                return None
            self.inbox += chunk

    # -- one job ---------------------------------------------------------------------------------

    def run(self, request):
        """Run one job (batch or interactive session); returns the final reply, or None at pool EOF."""
        self.number += 1
        workdir = os.path.join(self.scratch, f"job{self.number}")
        os.mkdir(workdir, 0o700)  # fresh and empty for every job
        if "uid" in self.measures:
            os.chown(workdir, jail.JOB_UID, jail.JOB_UID)
        for fd in self.capture:
            _rewind(fd)
        job = None
        finished = False
        try:
            job = _Job(request, workdir, self.capture, self.null, self.measures)
            if request.get("interactive"):
                if not self._session(job):
                    return None
                n_calls = 0
            else:
                job.pump(lambda data: False)  # until the child exits
                n_calls = len(request["calls"])
            wall, exit_code, cpu, peak = job.finish()
            finished = True
            cap = request["limits"]["max_output_bytes"]
            output_full = any(os.fstat(fd).st_size >= cap for fd in self.capture)
            outcome = _classify(job, exit_code, n_calls, bool(request.get("collect_files")), output_full)
            return self._reply(request, *outcome, wall, exit_code, cpu, peak)
        finally:
            if job is not None and not finished:  # interrupted by a worker-side error: leave nothing running
                _kill_group(job.pid)
                _kill_orphans()
            shutil.rmtree(workdir, ignore_errors=True)

    def _session(self, job):
        """The interactive protocol for one job; False if the pool went away."""
        loaded = job.pump(lambda data: b"\nloaded\n" in data)
        job.read_to = job.data.find(b"\nloaded\n") + len(b"\nloaded\n") if loaded else len(job.data)
        prefetched = None
        if loaded and job.request_calls:
            if job.pump(lambda data: data.find(b"\n", job.read_to) >= 0):
                try:
                    prefetched = json.loads(job.next_line())
                    if type(prefetched) is not list or len(prefetched) != job.request_calls:
                        prefetched = None
                except (ValueError, RecursionError):
                    prefetched = None
            if prefetched is None:
                _kill_group(job.pid)  # died, timed out or wrote garbage while answering the batch
        over = not loaded or (job.request_calls > 0 and prefetched is None)
        self.send({"loaded": loaded, "prefetched": prefetched, "ended": over})
        while True:
            frame = self.receive(None if over else job.deadline)
            if frame is None:
                return False
            if frame == "timeout":
                job.timed_out = over = True
                _kill_group(job.pid)
                continue
            if "end" in frame:
                if not over:
                    os.close(job.call_w)
                    job.call_w = None
                    job.pump(lambda data: False)  # the final line, then exit
                return True
            if over:
                self.send({"ended": True})
                continue
            child.write_all(job.call_w, (json.dumps(frame["call"]) + "\n").encode())
            if job.pump(lambda data: data.find(b"\n", job.read_to) >= 0):
                line = job.next_line()
                try:
                    outcome = json.loads(line)
                    if type(outcome) is not list or len(outcome) != 3 or type(outcome[0]) is not bool:
                        raise ValueError
                except (ValueError, RecursionError):
                    outcome = None
                if outcome is not None:
                    self.send({"outcome": outcome})
                    continue
            over = True  # the child died, timed out, overflowed or wrote garbage: the job is over
            _kill_group(job.pid)
            self.send({"ended": True})

    def _reply(self, request, status, error, outputs, files, wall, exit_code, cpu, peak):
        cap = request["limits"]["max_output_bytes"]
        return {
            "status": status,
            "outputs": outputs,
            "files": files,
            "error": error,
            "stdout": _read_capped(self.capture[0], cap),
            "stderr": _read_capped(self.capture[1], cap),
            "exit_code": exit_code,
            "wall_s": wall,
            "cpu_s": cpu,
            "peak_memory_kb": peak,
        }


def main(argv):
    scratch, config = argv[1], json.loads(argv[2])
    # Move the protocol pipes off 0/1 so nothing else in this process can write into the protocol.
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    # Ctrl-C in a terminal reaches the whole foreground group; the pool decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    jail.become_subreaper()
    jail.prepare(os.getpid())
    measures = [m for m in jail.probe() if m in config["measures"]]
    sys.path.extend(p for p in config.get("paths", []) if p not in sys.path)  # site-packages, after the stdlib
    preloaded, unavailable = [], {}
    for name in config.get("preload", []):
        try:
            importlib.import_module(name)  # inherited by every fork, so a job's import is free
            preloaded.append(name)
        except ImportError as error:  # reported: the pool refuses to start without what jobs need
            unavailable[name] = str(error)[:200]
    child.warm_up()
    if config.get("seal") and "seccomp" in measures:
        try:
            jail.seal()
        except OSError:
            pass  # not sealed: every job installs the whole filter itself, as outside bubblewrap
    worker = Worker(scratch, proto_in, proto_out, measures)
    worker.send({"hello": {"measures": measures, "preloaded": preloaded, "unavailable": unavailable}})
    while True:
        request = worker.receive()
        if request is None:
            return 0  # the pool closed our stdin: shut down
        try:
            reply = worker.run(request)
        except Exception as exc:  # noqa: BLE001 - the pool must get an answer for every request
            reply = {"status": "infra_error", "outputs": [], "error": f"worker: {child.describe(exc)}",
                     "stdout": "", "stderr": "", "exit_code": None, "wall_s": 0.0, "cpu_s": 0.0,
                     "peak_memory_kb": 0, "files": None}
        if reply is None:
            return 0
        worker.send(reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
