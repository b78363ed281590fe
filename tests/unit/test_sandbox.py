"""The sandbox pool: statuses, strict values, limits, worker recovery, order and determinism.

Kept small (two workers, short limits): the machine has two shared cores.
"""

from __future__ import annotations

import os
import select
import signal
import time

import pytest

from closedloop.sandbox import CallOutcome, ExecResult, Job, Limits, SandboxPool

LIMITS = Limits(timeout_s=1.0, memory_mb=256, max_output_bytes=4096)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=LIMITS) as shared:
        yield shared


def run_one(pool: SandboxPool, program: str, calls: list[list] | None = None) -> ExecResult:
    return pool.run([Job(program, "f", calls if calls is not None else [[1], [2]])])[0]


IDENTITY = "def f(x):\n    return x\n"


class TestStatuses:
    # (program, expected status, text the job error must contain); each row is one kind of bad code
    CASES = [
        (IDENTITY, "completed", ""),  # a plain function, with nothing to judge it
        ("def f(x):\n    return (\n", "error:parse", "SyntaxError: '(' was never closed (line 2)"),
        ("def f(x)\n    return x\n", "error:parse", "SyntaxError"),
        ("def f(x):\nreturn x\n", "error:parse", "IndentationError"),
        ("x = 1\x00\n", "error:parse", "null bytes"),  # compile() raises ValueError, not SyntaxError
        ("raise ValueError('boom')\ndef f(x): return x\n", "error:load", "ValueError: boom"),
        ("import sys\nsys.exit(0)\ndef f(x): return x\n", "error:load", "SystemExit: 0"),  # exit 0 is not ok
        ("import os\nos._exit(0)\ndef f(x): return x\n", "error:load", "exited with code 0 while loading"),
        ("g = 1\n", "error:load", "NameError: entry point 'f' is not defined"),
        ("f = 3\n", "error:load", "entry point 'f' is not callable"),
        ("import os\ndef f(x):\n    os._exit(0)\n", "killed", "exited with code 0 before returning from every call"),
        ("import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGSEGV)\n", "killed", "SIGSEGV"),
        ("def f(x):\n    while True:\n        pass\n", "timeout", "timed out after 1.0s"),
        ("def f(x):\n    return [0] * 10**9\n", "memory", "MemoryError"),  # one huge allocation
        ("def f(x):\n    a = []\n    while True:\n        a.append(bytearray(10**6))\n", "memory", "MemoryError"),
        ("def f(x):\n    print('y' * 10**6)\n    return x\n", "output_limit", "output exceeded 4096 bytes"),
        ("def f(x):\n    while True:\n        print('spam')\n", "output_limit", "output exceeded"),
        ("def f(x):\n    return 'z' * 10**5\n", "output_limit", "returned values exceed 4096 bytes"),
        ("import os\nos.write(3, b'x' * 10**5)\ndef f(x): return x\n", "output_limit", "result pipe"),
        # A limit hit the program survives is still that limit, whatever it returns after.
        ("import os, time\ndef f(x):\n    while True:\n        try:\n            pid = os.fork()\n"
         "        except OSError:\n            break\n        if pid == 0:\n            time.sleep(5)\n"
         "            os._exit(0)\n    return x\n", "process_limit", "hit the process limit (16 processes"),
        ("import _thread, time\ndef f(x):\n    try:\n        while True:\n"
         "            _thread.start_new_thread(time.sleep, (5,))\n    except RuntimeError:\n        pass\n    return x\n",
         "process_limit", "a fork or thread start failed"),
        ("import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\ndef f(x):\n    try:\n"
         "        print('y' * 10**5, flush=True)\n    except OSError:\n        pass\n    return x\n",
         "output_limit", "output reached the 4096-byte cap"),
    ]

    @pytest.mark.parametrize("program, status, error", CASES)
    def test_status(self, pool, program, status, error):
        result = run_one(pool, program)
        status, _, failed_step = status.partition(":")
        assert result.status == status, result
        assert error in result.error
        assert result.isolation == pool.isolation
        assert (len(result.outputs) == 2) == (status == "completed")  # partial outputs are never reported
        if failed_step == "parse":
            assert (result.steps["parses"], result.steps["loads"]) == (False, False)
        elif failed_step == "load":
            assert (result.steps["parses"], result.steps["loads"]) == (True, False)

    def test_a_timeout_leaves_the_pool_working(self, pool):
        loop = Job("def f(x):\n    while True:\n        pass\n", "f", [[1]])
        results = pool.run([loop, Job(IDENTITY, "f", [[5]])])
        assert [r.status for r in results] == ["timeout", "completed"]
        assert results[0].exit_code == -signal.SIGKILL and 1.0 <= results[0].wall_s < 1.5
        assert results[1].outputs == [CallOutcome(True, 5, "")]

    def test_printed_output_is_captured_and_capped(self, pool):
        result = run_one(pool, "import sys\ndef f(x):\n    print('hi', x)\n    print('err', file=sys.stderr)\n    return x\n")
        assert (result.status, result.stdout, result.stderr) == ("completed", "hi 1\nhi 2\n", "err\nerr\n")
        flood = run_one(pool, "print('y' * 10**6)\ndef f(x): return x\n")
        assert flood.status == "output_limit" and len(flood.stdout) == LIMITS.max_output_bytes


class TestCalls:
    # (function body, args, expected CallOutcome); what one call may return or raise
    CASES = [
        ("return 10 // x", [0], CallOutcome(False, None, "ZeroDivisionError: integer division or modulo by zero")),
        ("return (x, [x], {'k': x})", [1], CallOutcome(True, (1, [1], {"k": 1}), "")),  # a tuple stays a tuple
        ("return x == 1", [1], CallOutcome(True, True, "")),  # bool stays bool
        ("return 1.5", [1], CallOutcome(True, 1.5, "")),
        ("return x + '\\u00e9\\u20ac\\ud800'", ["s"], CallOutcome(True, "s\u00e9\u20ac\ud800", "")),  # any str survives, lone surrogates too
        ("return None", [1], CallOutcome(True, None, "")),
        ("class I(int): pass\n    return I(3)", [1], CallOutcome(False, None, "TypeError: returned non-plain value of type I")),
        ("class E:\n        def __eq__(self, other): return True\n    return E()", [1],
         CallOutcome(False, None, "TypeError: returned non-plain value of type E")),
        ("class S(str): pass\n    return [S('a')]", [1], CallOutcome(False, None, "TypeError: returned non-plain value of type S")),
        ("return {1: 2, (1, 'a'): None}", [1], CallOutcome(True, {1: 2, (1, "a"): None}, "")),
        ("return [{1, 2}, frozenset('a')]", [1], CallOutcome(True, [{1, 2}, frozenset("a")], "")),
        ("return float('-inf')", [1], CallOutcome(True, float("-inf"), "")),
        ("return b'x'", [1], CallOutcome(False, None, "TypeError: returned non-plain value of type bytes")),
        ("a = []\n    a.append(a)\n    return a", [1], CallOutcome(False, None, "ValueError: returned value nested deeper than 100 levels")),
        ("import sys\n    sys.exit(0)", [1], CallOutcome(False, None, "SystemExit: 0")),  # exit in a call fails that call
        ("return input()", [1], CallOutcome(False, None, "EOFError: EOF when reading a line")),  # stdin is empty
        ("raise KeyError(object())", [1], CallOutcome(False, None, "KeyError: <object object at 0x…>")),  # addresses masked
    ]

    @pytest.mark.parametrize("body, args, outcome", CASES)
    def test_outcome(self, pool, body, args, outcome):
        result = run_one(pool, f"def f(x):\n    {body}\n", [args])
        assert result.status == "completed", result
        assert result.outputs == [outcome]

    def test_an_exception_fails_only_its_call(self, pool):
        result = run_one(pool, "def f(x):\n    return 10 // x\n", [[2], [0], [5]])
        assert [o.ok for o in result.outputs] == [True, False, True]
        assert [o.value for o in result.outputs] == [5, None, 2]


class TestIsolation:
    def test_each_job_starts_in_a_fresh_empty_directory(self, pool):
        program = "import os\nfiles = os.listdir('.')\nopen('left.txt', 'w').write('x')\ndef f(x): return files\n"
        results = pool.run([Job(program, "f", [[0]]) for _ in range(4)])
        assert all(r.outputs == [CallOutcome(True, [], "")] for r in results)

    def test_the_program_sees_neither_the_callers_environment_nor_closedloop(self, monkeypatch):
        monkeypatch.setenv("CLOSEDLOOP_SECRET", "x")
        program = (
            "import os\n"
            "def f(x):\n"
            "    try:\n        import closedloop\n        found = True\n"
            "    except ImportError:\n        found = False\n"
            "    return [sorted(os.environ), found]\n"
        )
        with SandboxPool(workers=1, limits=LIMITS) as fresh:  # started after the variable was set
            names, found = run_one(fresh, program, [[0]]).outputs[0].value
        assert "CLOSEDLOOP_SECRET" not in names and "PYTHONHASHSEED" in names
        assert found is False


class TestPool:
    def test_results_follow_job_order(self, pool):
        # Jobs of uneven length on two workers finish out of order; results must not.
        jobs = [Job(f"import time\ndef f(x):\n    time.sleep({(i % 3) * 0.02})\n    return {i}\n", "f", [[0]]) for i in range(12)]
        assert [r.outputs[0].value for r in pool.run(jobs)] == list(range(12))

    def test_repeated_runs_are_deterministic(self, pool):
        programs = [
            "def f(x):\n    return list({'apple', 'pear', 'fig', 'kiwi', x})\n",  # str set order: fixed hash seed
            "import random\ndef f(x):\n    return random.random()\n",  # seeded per job
            "def f(x):\n    return 1 // (x - 2)\n",
            "def f(x):\n    return (\n",
            "def f(x):\n    raise KeyError(object())\n",
        ]
        jobs = [Job(p, "f", [["q"]] if "apple" in p else [[1], [2]]) for p in programs]

        def strip(results):
            return [(r.status, r.outputs, r.error, r.stdout, r.stderr, r.exit_code) for r in results]

        first = strip(pool.run(jobs))
        assert strip(pool.run(jobs)) == first
        with SandboxPool(workers=1, limits=LIMITS) as other:
            assert strip(other.run(jobs)) == first

    def test_a_killed_worker_is_restarted(self):
        with SandboxPool(workers=2, limits=LIMITS) as pool:
            victim = pool.worker_pids()[0]
            os.kill(victim, signal.SIGKILL)
            results = pool.run([Job(IDENTITY, "f", [[i]]) for i in range(6)])
            assert [r.outputs[0].value for r in results] == list(range(6))
            assert victim not in pool.worker_pids() and pool.restarts >= 1

    def test_a_worker_that_dies_mid_job_is_an_infra_error_after_one_retry(self):
        # A job cannot kill its worker (tests/unit/test_sandbox_attacks.py); a worker that exits on
        # its own (here: told a job is too long to frame) stands in for a crash.
        with SandboxPool(workers=1, limits=LIMITS) as pool:
            worker = pool._workers[0]
            os.kill(worker.proc.pid, signal.SIGKILL)
            # The pid is bubblewrap's where the jail has one; the jailed worker it started dies a moment
            # later (--die-with-parent) and, under load, could still answer a job sent in between.
            # Its output pipe reaching end-of-file is the whole worker gone.
            deadline = time.monotonic() + 30
            while select.select([worker.out_fd], [], [], 1.0)[0] == [] or os.read(worker.out_fd, 1 << 16):
                assert time.monotonic() < deadline, "the killed worker's pipe never closed"
            results = pool.run([Job(IDENTITY, "f", [[7]])])
            assert results[0].outputs == [CallOutcome(True, 7, "")] and pool.restarts == 1

    def test_trivial_jobs_are_fast(self, pool):
        jobs = [Job(IDENTITY, "f", [[i] for i in range(6)]) for _ in range(200)]
        start = time.perf_counter()
        results = pool.run(jobs)
        assert all(r.status == "completed" for r in results)
        assert time.perf_counter() - start < 10.0  # ~0.3 s on two idle cores; generous for a shared machine

    def test_progress_goes_to_stderr(self, pool, capsys):
        pool.run([Job(IDENTITY, "f", [[1]])] * 3, progress=True)
        assert "sandbox: 3/3 jobs" in capsys.readouterr().err

    def test_empty_batch(self, pool):
        assert pool.run([]) == []

    def test_calls_must_be_json_data(self, pool):
        with pytest.raises(ValueError, match="job 1: calls must be plain data"):
            pool.run([Job(IDENTITY, "f", [[1]]), Job(IDENTITY, "f", [[object()]])])

    def test_a_closed_pool_refuses_work(self):
        pool = SandboxPool(workers=1, limits=LIMITS)
        pool.close()
        with pytest.raises(RuntimeError, match="closed"):
            pool.run([Job(IDENTITY, "f", [[1]])])

    @pytest.mark.parametrize("kwargs, message", [
        ({"timeout_s": 0}, r"Limits.timeout_s \(0\) must be > 0"),
        ({"memory_mb": 8}, r"Limits.memory_mb \(8\) must be >= 32"),
        ({"max_output_bytes": 10}, r"Limits.max_output_bytes \(10\) must be >= 1024"),
    ])
    def test_limits_are_checked(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            Limits(**kwargs)


class TestInterpreterInJail:
    def test_site_packages_are_bound_after_the_private_tmp(self):
        """A checkout or virtual environment under /tmp (a CI clone) stays visible in the jail."""
        from closedloop.sandbox.isolation import bwrap_argv, site_dirs

        pytest.importorskip("shutil").which("bwrap") or pytest.skip("bubblewrap not installed")
        argv = bwrap_argv(1)
        tmpfs = argv.index("--tmpfs")
        for site in site_dirs():
            binds = [i for i, arg in enumerate(argv) if arg == "--ro-bind" and argv[i + 1] == site]
            assert all(i > tmpfs for i in binds), (site, argv)

    def test_a_module_the_workers_cannot_import_stops_the_pool(self):
        from closedloop.sandbox import SandboxUnavailable

        with pytest.raises(SandboxUnavailable, match="cannot import no_such_module_xyz"):
            SandboxPool(workers=1, limits=Limits(timeout_s=1.0), preload=("json", "no_such_module_xyz"))

    def test_third_party_modules_import_in_jobs(self):
        pytest.importorskip("pandas")
        with SandboxPool(workers=1, limits=Limits(timeout_s=5.0, memory_mb=2048), preload=("pandas",)) as pool:
            program = "import pandas as pd\ndef f():\n    return int(pd.DataFrame({'a': [1, 2]}).a.sum())\n"
            [result] = pool.run([Job(program, "f", [[]], expected=[3])])
        assert result.status == "passed", result
