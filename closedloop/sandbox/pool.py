"""SandboxPool: run untrusted, model-written programs in long-lived, jailed fork servers.

Each worker is a fresh small interpreter (worker.py, stdlib only, with the allowed libraries
preloaded) started inside bubblewrap where this machine allows it (isolation.py); it forks one
confined child per job, so the cost of a job does not depend on what the caller has loaded (torch
makes each fork ~25 ms; a small worker ~1 ms). One thread per worker drives it over pipes with
length-prefixed JSON frames; the trusted grading (expected values, HumanEval-style test programs)
runs in those threads, on this side of the boundary.

A script job (empty entry point) runs its program once, with no calls; with ``Job.collect_files``
the job process reports its directory's resulting tree, which comes back as ``ExecResult.files``.

Why outputs are empty unless every call ran: after a timeout the number of calls that finished
depends on machine load, and results must be deterministic for the same job.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import random
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from closedloop.sandbox import isolation as jail_setup
from closedloop.sandbox.child import decode, encode
from closedloop.sandbox.grader import CandidateError, JobOver, TestProgram, TestVerdict, call_key, same_value
from closedloop.sandbox.records import ISOLATION_MODES, CallOutcome, ExecResult, Job, Limits, infra_error

_HEADER = struct.Struct(">I")
# A worker that has not answered this long after a job's own wall-clock limit is presumed hung.
_GRACE_S = 10.0
_START_TIMEOUT_S = 30.0
# Imported once by every worker, so jobs that import them pay nothing (all stdlib).
DEFAULT_PRELOAD = (
    "bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "enum", "fractions", "functools",
    "hashlib", "heapq", "itertools", "json", "math", "operator", "random", "re", "statistics", "string", "typing",
)


class SandboxUnavailable(RuntimeError):
    """The isolation asked for cannot be provided on this machine."""


class _Lost(Exception):
    """The worker died, hung or broke protocol: an infrastructure failure, not the job's."""


def _worker_env() -> dict[str, str]:
    # An explicit, minimal environment: nothing of the caller's (tokens, PYTHON* settings) reaches the
    # sandboxed program, and a fixed hash seed makes set/dict-of-str iteration order reproducible.
    return {"PATH": os.defpath, "PYTHONHASHSEED": "0", "PYTHONUTF8": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": "/tmp", "HOME": "/tmp", "LANG": "C.UTF-8"}


class _Worker:
    """One worker process, started and greeted."""

    def __init__(self, argv: list[str], scratch: Path) -> None:
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_worker_env(),
                                     cwd=str(scratch), close_fds=True, bufsize=0)
        self.out_fd = self.proc.stdout.fileno()
        self.inbox = bytearray()
        self.jobs_run = 0
        try:
            hello = self.receive(_START_TIMEOUT_S)["hello"]
        except (_Lost, KeyError, TypeError) as error:
            self.stop(kill=True)
            raise SandboxUnavailable(f"a sandbox worker failed to start ({error})") from None
        self.measures: list[str] = hello["measures"]
        self.preloaded: list[str] = hello["preloaded"]
        self.unavailable: dict[str, str] = hello.get("unavailable", {})

    def send(self, message: dict[str, Any]) -> None:
        payload = json.dumps(message).encode()  # ASCII escapes carry any str, lone surrogates included
        frame = memoryview(_HEADER.pack(len(payload)) + payload)
        try:
            while frame:
                frame = frame[os.write(self.proc.stdin.fileno(), frame):]
        except OSError as error:
            raise _Lost(f"worker pipe closed ({error})") from None

    def receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.inbox) >= _HEADER.size:
                size = _HEADER.unpack_from(self.inbox)[0]
                if len(self.inbox) >= _HEADER.size + size:
                    body = bytes(self.inbox[_HEADER.size:_HEADER.size + size])
                    del self.inbox[:_HEADER.size + size]
                    try:
                        message = json.loads(body)
                    except ValueError:
                        raise _Lost("worker sent a malformed frame") from None
                    if type(message) is not dict:
                        raise _Lost("worker sent a malformed frame")
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.out_fd], [], [], remaining)[0]:
                raise _Lost(f"worker did not answer within {timeout:.1f}s")
            try:
                chunk = os.read(self.out_fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                raise _Lost(f"worker exited (code {self.proc.poll()})")
            self.inbox += chunk

    def stop(self, kill: bool = False, timeout: float = 2.0) -> None:
        if kill:
            self.proc.kill()
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


class _Candidate:
    """``candidate`` for a trusted test program: each call is a round trip to the job process."""

    def __init__(self, worker: _Worker, timeout: float, prefetched: dict[str, list]) -> None:
        self.worker, self.timeout = worker, timeout
        self.prefetched = prefetched  # call key -> [ok, value, error], answered in the job's first batch
        self.calls = self.raised = 0
        self.ended = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.ended:
            raise JobOver
        if kwargs:
            raise TypeError("candidate: keyword arguments cannot cross the sandbox boundary")
        try:
            encoded = encode(list(args))
        except (TypeError, ValueError) as error:
            raise TypeError(f"candidate: arguments must be plain data ({error})") from None
        outcome = self.prefetched.get(call_key(encoded))
        if outcome is None:
            self.worker.send({"call": encoded})
            reply = self.worker.receive(self.timeout)
            if "outcome" not in reply:
                self.ended = True
                raise JobOver
            outcome = reply["outcome"]
        if type(outcome) is not list or len(outcome) != 3:
            raise _Lost("worker sent a malformed call outcome")
        ok, value, error = outcome
        self.calls += 1
        if not ok:
            self.raised += 1
            raise CandidateError(str(error))
        try:
            return decode(value)
        except (ValueError, RecursionError):
            self.raised += 1
            raise CandidateError("the call returned a malformed value") from None


def job_seed(job: Job) -> int:
    """A per-job seed for shuffling test order: fixed for the same job, so verdicts are repeatable."""
    digest = hashlib.sha256(json.dumps([job.program, job.calls, job.test], default=repr).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class SandboxPool:
    """Run jobs in jailed processes; results come back in job order and never raise on bad code.

    Use as a context manager (or call ``close``). Calls to ``run`` from several threads are serialised.

    ``isolation``: "auto" takes the strongest level this machine allows and says once on stderr if that
    is below bubblewrap + uid + seccomp; "bwrap" refuses to start without bubblewrap; "fork" skips it.
    """

    def __init__(self, workers: int = 0, limits: Limits = Limits(), isolation: str = "auto",
                 preload: tuple[str, ...] = DEFAULT_PRELOAD, recycle_after: int = 5000) -> None:
        if workers < 0:
            raise ValueError(f"SandboxPool workers ({workers}) must be >= 0 (0 means one per core)")
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"SandboxPool isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        self.limits = limits
        self.size = workers or os.cpu_count() or 1
        self.recycle_after = recycle_after
        self.restarts = 0  # workers replaced after dying or hanging, over the pool's life
        self._use_bwrap = self._choose_bwrap(isolation)
        # "seal": a worker alone in bubblewrap's pid namespace installs the seccomp filter on itself
        # once, and its jobs inherit it (jail.seal); outside one, each job installs its own.
        self._config = json.dumps({"measures": ["uid", "seccomp"], "preload": list(preload),
                                   "paths": jail_setup.site_dirs(), "seal": self._use_bwrap})
        self._root = Path(tempfile.mkdtemp(prefix="closedloop-sandbox-"))
        self._lock = threading.Lock()
        self._spawned = 0
        self._tests: dict[tuple[str, str], TestProgram] = {}
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: list[_Worker] = []
        self._executor: ThreadPoolExecutor | None = None
        try:
            self._workers = [self._spawn() for _ in range(self.size)]
        except BaseException:
            self.close()
            raise
        unavailable = self._workers[0].unavailable
        if unavailable:  # every job that imports them would fail: say so now, not as a 0% pass rate
            self.close()
            raise SandboxUnavailable("sandbox workers cannot import " + "; ".join(
                f"{name} ({error})" for name, error in sorted(unavailable.items())))
        for worker in self._workers:
            self._idle.put(worker)
        measures = self._workers[0].measures
        self.isolation = "+".join((["bwrap"] if self._use_bwrap else ["fork"]) + measures + ["rlimits"])
        missing = [m for m in ("uid", "seccomp") if m not in measures]
        if missing:
            isolation_note = "; ".join(
                {"uid": "jobs keep the pool's uid (dropping to an unprivileged uid needs root)",
                 "seccomp": "no seccomp filter (only x86_64 Linux is supported)"}[m] for m in missing)
            jail_setup.warn_once(f"isolation is {self.isolation}: {isolation_note}")
        self._executor = ThreadPoolExecutor(self.size, thread_name_prefix="sandbox")

    @staticmethod
    def _choose_bwrap(mode: str) -> bool:
        if mode == "fork":
            return False
        works, why = jail_setup.bwrap_works()
        if not works and mode == "bwrap":
            raise SandboxUnavailable(f"isolation 'bwrap' was asked for, but {why}")
        if not works:
            jail_setup.warn_once(f"{why}; jobs run without namespaces (install bubblewrap for full isolation)")
        return works

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
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
        return [worker.proc.pid for worker in self._workers]

    def _spawn(self) -> _Worker:
        self._spawned += 1
        scratch = self._root / f"w{self._spawned}"
        return _Worker(jail_setup.worker_argv(self._use_bwrap, self.limits.disk_mb, scratch, self._config), scratch)

    def _replace(self, worker: _Worker) -> _Worker:
        """Kill ``worker`` (dead, hung, spent) and put a fresh one in its slot."""
        worker.stop(kill=True)
        fresh = self._spawn()
        with self._lock:
            self._workers[self._workers.index(worker)] = fresh
        return fresh

    # -- running jobs ----------------------------------------------------------------------------

    def run(self, jobs: list[Job], progress: bool = False) -> list[ExecResult]:
        """Run every job (retrying once on a worker failure); one result per job, in job order."""
        if self._executor is None:
            raise RuntimeError("SandboxPool is closed")
        report = _Progress(len(jobs)) if progress else None
        cancelled = threading.Event()
        futures = []
        results = []
        try:
            # Each job goes to the workers as soon as its request is built, so the workers are not idle
            # while the test programs of a new task set are parsed. A job that cannot be sent (calls
            # that are not plain data, a test without check) still fails the whole run: the jobs
            # already started are cancelled and their results dropped.
            for index, job in enumerate(jobs):
                futures.append(self._executor.submit(self._execute, job, self._request(index, job), cancelled))
            for future in futures:
                results.append(future.result())
                if report:
                    report.update(len(results))
        except BaseException:
            cancelled.set()  # e.g. KeyboardInterrupt: the threads finish their current job and stop
            for future in futures:
                future.cancel()
            raise
        finally:
            if report:
                report.finish()
        return results

    def _request(self, index: int, job: Job) -> tuple[dict[str, Any], list[int], int]:
        """The wire request for ``job``, the order its calls are sent in (shuffled per job), its seed."""
        # A test program's literal calls go with the job, answered in one batch (see grader._static_calls).
        call_list = self._test_program(job).static_calls if job.test is not None else job.calls
        seed = job_seed(job)
        order = list(range(len(call_list)))
        random.Random(seed).shuffle(order)
        try:
            calls = [encode(list(call_list[i])) for i in order]
        except (TypeError, ValueError) as error:
            raise ValueError(f"job {index}: calls must be plain data ({error})") from None
        limits = dict((job.limits or self.limits).to_wire())
        request = {"program": job.program, "entry_point": job.entry_point, "calls": calls, "limits": limits,
                   "files": job.files, "allow_exec": limits.pop("allow_exec"), "interactive": job.test is not None,
                   "collect_files": job.collect_files}
        return request, order, seed

    def _execute(self, job: Job, request: tuple[dict[str, Any], list[int], int], cancelled: threading.Event) -> ExecResult:
        if cancelled.is_set():
            return infra_error("cancelled", self.isolation)
        worker = self._idle.get()
        try:
            failure = ""
            for _attempt in range(2):
                try:
                    result = self._attempt(worker, job, *request)
                except _Lost as error:
                    failure = str(error)
                    worker = self._replace(worker)
                    self.restarts += 1
                    continue
                if result.status != "infra_error":
                    break
                failure = result.error
            else:
                return infra_error(f"the sandbox failed twice on this job: {failure}", self.isolation)
            worker.jobs_run += 1
            if worker.jobs_run >= self.recycle_after:
                worker = self._replace(worker)  # recycled: nothing a long life accumulates survives
            return result
        finally:
            self._idle.put(worker)

    def _attempt(self, worker: _Worker, job: Job, request: dict[str, Any], order: list[int], seed: int) -> ExecResult:
        timeout = request["limits"]["timeout_s"] + _GRACE_S
        worker.send(request)
        verdict = candidate = None
        if job.test is not None:
            opening = worker.receive(timeout)
            if opening.get("loaded") and not opening.get("ended"):
                sent = [call_key(args) for args in request["calls"]]
                candidate = _Candidate(worker, timeout, dict(zip(sent, opening.get("prefetched") or [])))
                try:
                    verdict = self._test_program(job).run(candidate, seed, job.entry_point)
                except JobOver:
                    verdict = None
            worker.send({"end": True})
        reply = worker.receive(timeout)
        if "status" not in reply:
            raise _Lost("worker broke protocol")
        return self._result(job, reply, order, verdict, candidate)

    def _test_program(self, job: Job) -> TestProgram:
        key = (job.prelude, job.test or "")
        if key not in self._tests:
            self._tests[key] = TestProgram(job.prelude, job.test or "")
        return self._tests[key]

    def _result(self, job: Job, reply: dict[str, Any], order: list[int], verdict: TestVerdict | None,
                candidate: _Candidate | None) -> ExecResult:
        raw, error = reply["status"], reply["error"]
        steps: dict[str, Any] = {"parses": raw != "syntax_error", "loads": raw not in ("syntax_error", "load_error"),
                                 "runs": False, "tests_passed": 0, "tests_total": len(job.calls)}
        outputs: list[CallOutcome] = []
        if raw in ("syntax_error", "load_error"):
            status = "error"
        elif raw == "infra_error":
            return infra_error(error, self.isolation)
        elif raw != "ok":
            status = raw
        elif job.test is not None:
            status, error = self._judge_test(verdict, candidate, steps)
        else:
            status, error, outputs = self._judge_calls(job, reply["outputs"], order, steps)
        return ExecResult(
            status=status, outputs=outputs, error=error, stdout=reply["stdout"], stderr=reply["stderr"],
            exit_code=reply["exit_code"], wall_s=reply["wall_s"], cpu_s=reply["cpu_s"],
            peak_memory_kb=reply["peak_memory_kb"], isolation=self.isolation, steps=steps,
            files=_tree(reply.get("files")) if job.collect_files and raw == "ok" else None,
        )

    @staticmethod
    def _judge_test(verdict: TestVerdict | None, candidate: _Candidate | None, steps: dict[str, Any]) -> tuple[str, str]:
        assert verdict is not None and candidate is not None
        steps.update(runs=candidate.raised == 0, tests_passed=verdict.passed, tests_total=verdict.total)
        # Passing takes positive evidence: asserts that held on values the program returned.
        if verdict.completed and candidate.calls > 0 and verdict.total > 0 and verdict.passed == verdict.total:
            return "passed", ""
        if not verdict.error and candidate.calls == 0:
            return "failed", "the test never called the candidate"
        return "failed", verdict.error or "the test did not complete"

    @staticmethod
    def _judge_calls(job: Job, sent: list, order: list[int], steps: dict[str, Any]) -> tuple[str, str, list[CallOutcome]]:
        outputs: list[CallOutcome | None] = [None] * len(order)
        for position, (ok, value, error) in zip(order, sent):
            if ok:
                try:
                    value = decode(value)
                except (ValueError, RecursionError):
                    ok, value, error = False, None, "the call returned a malformed value"
            outputs[position] = CallOutcome(bool(ok), value if ok else None, "" if ok else str(error))
        if job.expected is not None:
            outputs = [CallOutcome(o.ok, o.value, o.error, o.ok and same_value(want, o.value))
                       for o, want in zip(outputs, job.expected)]
        done: list[CallOutcome] = outputs  # type: ignore[assignment]
        steps["runs"] = all(o.ok for o in done)
        if job.expected is None:
            steps["tests_passed"] = None
            return "completed", "", done
        passed = sum(bool(o.passed) for o in done)
        steps["tests_passed"] = passed
        if not done:
            return "failed", "the job has no calls to judge", done
        if passed == len(done):
            return "passed", "", done
        index = next(i for i, o in enumerate(done) if not o.passed)
        outcome = done[index]
        what = f"raised {outcome.error}" if not outcome.ok else f"returned {_short(outcome.value)}, expected {_short(job.expected[index])}"
        return "failed", f"call {index} {job.entry_point}(*{_short(job.calls[index])}) {what}", done


def _tree(files: Any) -> dict[str, str] | None:
    """The reported file tree, if it has the shape the worker checked (a dict of str to str)."""
    if type(files) is not dict or not all(type(k) is str and type(v) is str for k, v in files.items()):
        return None
    return files


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
