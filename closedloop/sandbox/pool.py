"""SandboxPool: run untrusted, model-written programs in long-lived worker processes.

Each worker is a fresh small interpreter (worker.py, stdlib only) that forks one child per job, so
the cost of a job does not depend on what the caller has loaded (torch makes each fork ~25 ms; a
small worker ~1.5 ms). The pool talks to workers over pipes with length-prefixed JSON frames and
multiplexes them with a selector from the calling thread: no threads, no multiprocessing.

Why outputs are empty unless status is "ok": after a timeout the number of calls that finished
depends on machine load, and results must be deterministic for the same job.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from closedloop.sandbox.records import ISOLATION, STATUSES, CallOutcome, ExecResult, Job, Limits, infra_error
WORKER_SCRIPT = Path(__file__).with_name("worker.py")
_HEADER = struct.Struct(">I")
# A worker that has not answered this long after a job's own wall-clock limit is presumed hung.
_GRACE_S = 10.0


def _worker_env() -> dict[str, str]:
    # An explicit, minimal environment: nothing of the caller's (tokens, PYTHON* settings) reaches the
    # sandboxed program, and a fixed hash seed makes set/dict-of-str iteration order reproducible.
    return {
        "PATH": os.defpath,
        "PYTHONHASHSEED": "0",
        "PYTHONUTF8": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": tempfile.gettempdir(),
    }


class _Worker:
    """One worker process and the job it is running (an index into the current run's jobs)."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        # -s -S: no site-packages (the worker and the programs get the stdlib only); -B: no .pyc.
        # Not -I: it would ignore PYTHONHASHSEED, which determinism needs.
        self.proc = subprocess.Popen(
            [sys.executable, "-s", "-S", "-B", str(WORKER_SCRIPT), str(scratch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_worker_env(),
            cwd=str(scratch),
            close_fds=True,
            bufsize=0,
        )
        self.out_fd = self.proc.stdout.fileno()
        self.inbox = bytearray()
        self.job: int | None = None
        self.deadline = float("inf")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, frame: bytes) -> None:
        fd = self.proc.stdin.fileno()
        view = memoryview(frame)
        while view:
            view = view[os.write(fd, view):]

    def take_reply(self) -> dict[str, Any] | None:
        """A complete reply frame from the inbox, if one has arrived."""
        if len(self.inbox) < _HEADER.size:
            return None
        size = _HEADER.unpack_from(self.inbox)[0]
        if len(self.inbox) < _HEADER.size + size:
            return None
        body = bytes(self.inbox[_HEADER.size : _HEADER.size + size])
        del self.inbox[: _HEADER.size + size]
        return json.loads(body)

    def stop(self, timeout: float = 2.0) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # EOF on stdin is the worker's signal to exit
            except OSError:
                pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


class SandboxPool:
    """Run jobs in sandboxed processes; results come back in job order and never raise on bad code.

    Use as a context manager (or call ``close``). ``run`` is not re-entrant: calls from several
    threads are serialised.
    """

    def __init__(self, workers: int = 0, limits: Limits = Limits()) -> None:
        if workers < 0:
            raise ValueError(f"SandboxPool workers ({workers}) must be >= 0 (0 means one per core)")
        self.limits = limits
        self.size = workers or os.cpu_count() or 1
        self.restarts = 0  # workers replaced after dying or hanging, over the pool's life
        self._root = Path(tempfile.mkdtemp(prefix="closedloop-sandbox-"))
        self._lock = threading.Lock()
        self._spawned = 0
        self._workers: list[_Worker] = []
        try:
            self._workers = [self._spawn() for _ in range(self.size)]
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()
        shutil.rmtree(self._root, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down modules
            pass

    def worker_pids(self) -> list[int]:
        return [worker.pid for worker in self._workers]

    def _spawn(self) -> _Worker:
        self._spawned += 1
        return _Worker(self._root / f"w{self._spawned}")

    def _replace(self, worker: _Worker, selector: selectors.BaseSelector | None) -> _Worker:
        """Kill ``worker`` (dead, hung, or holding a reply nobody will read) and put a fresh one in its slot."""
        if selector is not None:
            try:
                selector.unregister(worker.out_fd)
            except (KeyError, ValueError):
                pass
        worker.proc.kill()
        worker.stop()
        fresh = self._spawn()
        self._workers[self._workers.index(worker)] = fresh
        if selector is not None:
            selector.register(fresh.out_fd, selectors.EVENT_READ, fresh)
        self.restarts += 1
        return fresh

    # -- running jobs ----------------------------------------------------------------------------

    def _frame(self, index: int, job: Job) -> bytes:
        limits = {
            "timeout_s": self.limits.timeout_s,
            "memory_mb": self.limits.memory_mb,
            "max_output_bytes": self.limits.max_output_bytes,
        }
        request = {"program": job.program, "entry_point": job.entry_point, "calls": job.calls, "limits": limits}
        try:
            payload = json.dumps(request).encode()  # ASCII escapes carry any str, lone surrogates included
        except (TypeError, ValueError) as error:
            raise ValueError(f"job {index}: calls must be plain JSON data ({error})") from None
        return _HEADER.pack(len(payload)) + payload

    def _result(self, reply: dict[str, Any]) -> ExecResult:
        status = reply.get("status")
        if status not in STATUSES:
            return infra_error(f"worker replied with unknown status {status!r}", ISOLATION)
        outputs = [CallOutcome(bool(ok), value if ok else None, error) for ok, value, error in reply["outputs"]]
        return ExecResult(
            status=status,
            outputs=outputs,
            error=reply["error"],
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            exit_code=reply["exit_code"],
            wall_s=reply["wall_s"],
            isolation=ISOLATION,
        )

    def run(self, jobs: list[Job], progress: bool = False) -> list[ExecResult]:
        """Run every job once (retrying once on a worker crash); one result per job, in job order."""
        if not self._workers:
            raise RuntimeError("SandboxPool is closed")
        frames = [self._frame(i, job) for i, job in enumerate(jobs)]
        with self._lock:
            return self._run(frames, progress)

    def _run(self, frames: list[bytes], progress: bool) -> list[ExecResult]:
        results: list[ExecResult | None] = [None] * len(frames)
        attempts = [0] * len(frames)
        queue = list(range(len(frames)))[::-1]  # a stack: pop() takes the next job in order
        done = 0
        report = _Progress(len(frames)) if progress else None
        selector = selectors.DefaultSelector()
        for worker in self._workers:
            selector.register(worker.out_fd, selectors.EVENT_READ, worker)

        def dispatch(worker: _Worker) -> None:
            # Loops because a worker found dead on send is replaced and the job handed to the fresh one.
            while queue and worker.job is None:
                index = queue.pop()
                worker.job = index
                worker.deadline = time.monotonic() + self.limits.timeout_s + _GRACE_S
                try:
                    worker.send(frames[index])
                except OSError:
                    worker = failed(worker)

        def failed(worker: _Worker) -> _Worker:
            nonlocal done
            index = worker.job
            fresh = self._replace(worker, selector)
            if index is not None:
                attempts[index] += 1
                if attempts[index] < 2:
                    queue.append(index)  # retry it next, on whichever worker is free first
                else:
                    results[index] = infra_error("sandbox worker died twice while running this job", ISOLATION)
                    done += 1
                    if report:
                        report.update(done)
            return fresh

        try:
            for worker in list(self._workers):
                dispatch(worker)
            while done < len(frames):
                soonest = min(w.deadline for w in self._workers)
                timeout = max(0.0, soonest - time.monotonic()) if soonest != float("inf") else None
                for key, _ in selector.select(timeout):
                    worker = key.data
                    try:
                        chunk = os.read(worker.out_fd, 1 << 16)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        dispatch(failed(worker))
                        continue
                    worker.inbox += chunk
                    reply = worker.take_reply()
                    if reply is not None and worker.job is not None:
                        results[worker.job] = self._result(reply)
                        done += 1
                        worker.job, worker.deadline = None, float("inf")
                        if report:
                            report.update(done)
                        dispatch(worker)
                now = time.monotonic()
                for worker in list(self._workers):
                    if worker.job is not None and worker.deadline <= now:
                        dispatch(failed(worker))  # hung: kill it, retry the job once
                # A job can be requeued while every other worker is idle; hand it out.
                for worker in list(self._workers):
                    dispatch(worker)
        finally:
            selector.close()
            if report:
                report.finish()
            # Only when interrupted (e.g. KeyboardInterrupt): a worker still busy would later hand
            # its stale reply to the next run, so replace it.
            for worker in list(self._workers):
                if worker.job is not None:
                    self._replace(worker, None)
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]


class _Progress:
    """A one-line progress report on stderr, at most twice a second (stdlib only, no tqdm)."""

    def __init__(self, total: int) -> None:
        self.total, self.start, self.last = total, time.monotonic(), 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= 0.5 or done == self.total:
            self.last = now
            rate = done / max(now - self.start, 1e-9)
            print(f"\rsandbox: {done}/{self.total} jobs ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)

    def finish(self) -> None:
        print(file=sys.stderr, flush=True)
