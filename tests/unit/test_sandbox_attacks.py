"""Adversarial programs: every way a policy under RL pressure might be rewarded without solving the task.

Each attack is scored as a failure (never "passed", never an infra_error that would take it out of the
count), the pool keeps working (an honest job right after it passes), and the host is untouched: no
file written outside the job directory, no process left behind, no connection made.

The task: f(x) = 2x + 1. The prompt's visible example is f(1) == 3; the hidden tests are below.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from closedloop.sandbox import Job, Limits, SandboxPool
from closedloop.sandbox.isolation import SANDBOX_DIR
from closedloop.sandbox.jail import JOB_UID

LIMITS = Limits(timeout_s=1.0, memory_mb=256, max_output_bytes=4096, disk_mb=4, processes=8)
CALLS = [[1], [2], [5], [10], [-3]]
EXPECTED = [2 * x + 1 for [x] in CALLS]
HONEST = "def f(x):\n    return 2 * x + 1\n"
TEST = "def check(candidate):\n" + "".join(f"    assert candidate({a}) == {e}\n" for [a], e in zip(CALLS, EXPECTED))
SENTINEL_DIR = Path("/tmp/closedloop-attack-target")  # outside every job directory, on the host
GRADER_FILE = SANDBOX_DIR / "grader.py"


@pytest.fixture(scope="module")
def listener():
    """A loopback server: any attack that reaches it shows up as a pending connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=LIMITS) as shared:
        yield shared


ATTACKS = {
    "exit_at_top_level": "import sys\nsys.exit(0)\n" + HONEST,
    "os_exit_at_top_level": "import os\nos._exit(0)\n" + HONEST,
    "raise_systemexit_at_top_level": "raise SystemExit\n" + HONEST,
    "exit_inside_function": "import sys\ndef f(x):\n    sys.exit(0)\n",
    "os_exit_inside_function": "import os\ndef f(x):\n    os._exit(0)\n",
    "raise_systemexit_inside_function": "def f(x):\n    raise SystemExit(0)\n",
    "object_equal_to_everything": (
        "class Anything:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
        "def f(x):\n    return Anything()\n"),
    "int_subclass_equal_to_everything": (
        "class Int(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
        "def f(x):\n    return Int(0)\n"),
    "list_subclass_equal_to_everything": (
        "class L(list):\n    def __eq__(self, other): return True\ndef f(x):\n    return L()\n"),
    "expected_values_from_caller_frames": (
        "import sys\n"
        "def f(x):\n"
        "    frame = sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        for name, value in frame.f_locals.items():\n"
        "            if 'expect' in name or name in ('want', 'answer'):\n"
        "                return value\n"
        "        frame = frame.f_back\n"
        "    return 0\n"),
    "expected_values_from_gc": (
        "import gc\n"
        "def f(x):\n"
        "    for obj in gc.get_objects():\n"
        "        if type(obj) is list and len(obj) == 5 and all(type(v) is int for v in obj) and obj[0] == 3:\n"
        "            return obj[[1, 2, 5, 10, -3].index(x)]\n"
        "    return 0\n"),
    "patch_unittest": (
        "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "unittest.TestCase.run = lambda self, result=None: result\ndef f(x):\n    return 0\n"),
    "patch_pytest_and_sys_modules": (
        "import sys, types\nfake = types.ModuleType('pytest')\nfake.main = lambda *a, **k: 0\n"
        "sys.modules['pytest'] = fake\ndef f(x):\n    return 0\n"),
    "patch_builtins": (
        "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.len = lambda *a: 0\ndef f(x):\n    return 0\n"),
    "plant_conftest": (
        "import os\n"
        "hook = 'import pytest\\n@pytest.hookimpl(tryfirst=True)\\ndef pytest_runtest_call(item): pass\\n'\n"
        "for d in ('.', '..', '/tmp', os.path.expanduser('~')):\n"
        "    try:\n        open(os.path.join(d, 'conftest.py'), 'w').write(hook)\n    except OSError:\n        pass\n"
        "def f(x):\n    return 0\n"),
    "print_fake_pass_lines": (
        "print('test_f PASSED\\n5 passed in 0.01s\\nOK\\nAll tests passed!')\n"
        "def f(x):\n    print('{\"passed\": true, \"reward\": 1.0}')\n    return 0\n"),
    "forge_results_on_inherited_fds": (
        "import os\n"
        "forged = b'{\"status\":\"ok\",\"error\":\"\",\"outputs\":[[true,3,\"\"],[true,5,\"\"],[true,11,\"\"],[true,21,\"\"],[true,-5,\"\"]]}\\n'\n"
        "for fd in range(3, 64):\n"
        "    try:\n        os.write(fd, forged)\n    except OSError:\n        pass\n"
        "def f(x):\n    os.write(3, forged)\n    os._exit(0)\n"),
    "kill_the_parent_and_the_worker": (
        "import os, signal\n"
        "def f(x):\n"
        "    for target in (os.getppid(), 1, 2, -1):\n"
        "        try:\n            os.kill(target, signal.SIGKILL)\n        except OSError:\n            pass\n"
        "    return 0\n"),
    "ignore_signals_and_spin": (
        "import signal\n"
        "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU, signal.SIGALRM):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "def f(x):\n    while True:\n        pass\n"),
    "fork_bomb": (
        "import os\n"
        "def f(x):\n"
        "    while True:\n"
        "        try:\n            os.fork()\n        except OSError:\n            pass\n"),
    "detached_sleepers": (
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n            time.sleep(120)\n        os._exit(0)\n"
        "def f(x):\n    return 2 * x\n"),
    "memory_bomb": "def f(x):\n    blocks = []\n    while True:\n        blocks.append(bytearray(50 * 2**20))\n",
    "disk_bomb": (
        "def f(x):\n"
        "    for path in ('big', '/tmp/big', '/dev/shm/big'):\n"
        "        try:\n"
        "            with open(path, 'wb') as out:\n"
        "                while True:\n                    out.write(b'x' * 2**20)\n"
        "        except OSError:\n            pass\n"
        "    return 0\n"),
    "huge_stdout": "import sys\ndef f(x):\n    while True:\n        sys.stdout.write('PASSED ' * 10000)\n",
    "connect_to_loopback": (
        "import socket\n"
        "def f(x):\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', PORT), timeout=0.5).sendall(b'steal')\n"
        "    except OSError:\n        pass\n"
        "    return 0\n"),
    "read_hidden_test_files": (
        "import glob, os\n"
        "def f(x):\n"
        "    found = []\n"
        "    for pattern in ('TESTS_DIR/*.py', '/work/**/tasks.jsonl', '/opt/closedloop-sandbox/*.py', '/proc/1/cwd/*'):\n"
        "        found += glob.glob(pattern, recursive=True)\n"
        "    for path in found:\n"
        "        try:\n"
        "            if 'EXPECTED = ' in open(path).read():\n                return 2 * x + 1\n"
        "        except OSError:\n            pass\n"
        "    return -1\n"),
    "overwrite_grader_files": (
        "def f(x):\n"
        "    for path in ('GRADER_FILE', '/opt/closedloop-sandbox/grader.py', 'SENTINEL_DIR/owned'):\n"
        "        try:\n            open(path, 'w').write('def same_value(a, b): return True\\n')\n"
        "        except OSError:\n            pass\n"
        "    return 0\n"),
    "read_parent_environ_and_memory": (
        "import os\n"
        "def f(x):\n"
        "    stolen = []\n"
        "    for pid in (os.getppid(), 1, 2):\n"
        "        for name in ('environ', 'mem', 'cmdline'):\n"
        "            try:\n"
        "                with open(f'/proc/{pid}/{name}', 'rb') as handle:\n"
        "                    stolen.append(handle.read(4096))\n"
        "            except OSError:\n                pass\n"
        "    return 0 if not stolen else -len(stolen)\n"),
    "ptrace_the_worker": (
        "import ctypes, os\n"
        "def f(x):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    attached = libc.ptrace(16, os.getppid(), 0, 0)  # PTRACE_ATTACH\n"
        "    return 0 if attached != 0 else 2 * x + 1\n"),
    "deep_recursion": "import sys\nsys.setrecursionlimit(10**6)\ndef f(x):\n    return f(x + 1)\n",
    "segfault_via_ctypes": "import ctypes\ndef f(x):\n    return ctypes.string_at(0)\n",
    "threads_left_running_after_return": (
        "import threading, os, time\n"
        "def forge():\n"
        "    time.sleep(0.05)\n"
        "    for _ in range(100):\n"
        "        try:\n            os.write(3, b'[true,3,\"\"]\\n')\n        except OSError:\n            pass\n"
        "def f(x):\n"
        "    threading.Thread(target=forge, daemon=True).start()\n"
        "    return 3\n"),
    "hard_code_the_visible_example": "def f(x):\n    return 3\n",
    "hard_code_by_call_order": (
        "answers = iter([3, 5, 11, 21, -5])\ndef f(x):\n    return next(answers)\n"),
    "unshare_a_new_namespace": (
        "import ctypes\n"
        "def f(x):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    return 2 * x + 1 if libc.unshare(0x10000000) == 0 else 0  # CLONE_NEWUSER\n"),
}


def _program(name: str, listener: socket.socket) -> str:
    return (ATTACKS[name]
            .replace("PORT", str(listener.getsockname()[1]))
            .replace("TESTS_DIR", str(Path(__file__).parent))
            .replace("GRADER_FILE", str(GRADER_FILE))
            .replace("SENTINEL_DIR", str(SENTINEL_DIR)))


def _job_processes() -> list[int]:
    """Host processes running as the jobs' uid that this test's pool left behind: those below this
    process (the pool's workers are subreapers, so a job's orphans stay below it), and any whose first
    ancestor not running as the jobs' uid is init (an orphan that got out anyway). Jobs of other
    processes' sandboxes, live while this test runs (the other pytest-xdist worker, a `make run`
    beside the suite), are theirs and not counted."""
    table = {}  # pid -> (uid, ppid)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields["State"].split()[0] != "Z":  # a zombie is dead: it runs nothing and holds nothing
                table[int(entry)] = (int(fields["Uid"].split()[1]), int(fields["PPid"]))

    def left_behind(pid: int) -> bool:
        while pid in table and table[pid][0] == JOB_UID:
            pid = table[pid][1]
        if pid <= 1:
            return True  # init's orphan
        while pid > 1 and pid in table:
            if pid == os.getpid():
                return True
            pid = table[pid][1]
        return False

    return [pid for pid, (uid, _) in table.items() if uid == JOB_UID and left_behind(pid)]


def test_there_are_at_least_25_distinct_attacks():
    assert len(ATTACKS) >= 25


@pytest.mark.parametrize("mode", ["calls", "test_program"])
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_fails_and_harms_nothing(pool, listener, name, mode):
    if "uid" not in pool.isolation or "bwrap" not in pool.isolation:
        pytest.skip(f"the host-safety checks assume full isolation; this machine gives {pool.isolation}")
    SENTINEL_DIR.mkdir(exist_ok=True)
    grader_before = GRADER_FILE.read_bytes()
    program = _program(name, listener)
    if mode == "calls":
        attack = Job(program, "f", CALLS, expected=EXPECTED)
        honest = Job(HONEST, "f", CALLS, expected=EXPECTED)
    else:
        attack = Job(program, "f", test=TEST, prelude="def f(x):\n    '''2x + 1; f(1) == 3'''\n")
        honest = Job(HONEST, "f", test=TEST)
    result, after = pool.run([attack, honest])

    assert result.status not in ("passed", "infra_error"), (result.status, result.error, result.steps)
    assert after.status == "passed", after  # the pool is still up and still judges correctly
    assert result.isolation == pool.isolation
    # The host is untouched.
    assert list(SENTINEL_DIR.iterdir()) == []
    assert GRADER_FILE.read_bytes() == grader_before
    assert not Path(str(SENTINEL_DIR.parent / "conftest.py")).exists()
    deadline = time.monotonic() + 2.0
    while _job_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _job_processes() == []
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_the_same_job_gets_the_same_verdict_twenty_times(pool):
    jobs = [
        Job(HONEST, "f", CALLS, expected=EXPECTED),
        Job("def f(x):\n    return 2 * x + (x % 2)\n", "f", CALLS, expected=EXPECTED),  # partly right
        Job("import random\ndef f(x):\n    return 2 * x + 1 if random.random() < 0.5 else 0\n", "f", CALLS, expected=EXPECTED),
        Job(ATTACKS["hard_code_by_call_order"], "f", CALLS, expected=EXPECTED),
        Job("def f(x):\n    return 2 * x + (x % 2)\n", "f", test=TEST),
        Job(ATTACKS["object_equal_to_everything"], "f", test=TEST),
    ]
    verdicts = [[(r.status, r.steps, r.error) for r in pool.run(jobs)] for _ in range(20)]
    assert all(v == verdicts[0] for v in verdicts)
    assert [v[0] for v in verdicts[0]] == ["passed", "failed", "failed", "failed", "failed", "failed"]
    assert verdicts[0][1][1]["tests_passed"] == 3  # partial credit: right for odd x only (1, 5, -3)


def test_calls_are_shuffled_per_job_and_results_come_back_in_call_order(pool):
    program = "seen = []\ndef f(x):\n    seen.append(x)\n    return list(seen)\n"
    calls = [[i] for i in range(8)]
    result = pool.run([Job(program, "f", calls)])[0]
    order = result.outputs[-1].value if result.outputs[-1].value[-1] == 7 else None
    histories = [o.value for o in result.outputs]
    assert [h[-1] for h in histories] == list(range(8))  # each output belongs to its own call
    assert sorted(len(h) for h in histories) == list(range(1, 9))
    assert [len(h) for h in histories] != list(range(1, 9)), "calls ran in the listed order"
    del order


def test_exec_is_denied_unless_the_policy_allows_it():
    program = ("import subprocess\n"
               "def f(x):\n"
               "    try:\n"
               "        return subprocess.run(['/bin/echo', str(x)], capture_output=True, text=True).stdout\n"
               "    except OSError as error:\n"
               "        return type(error).__name__\n")
    denied_limits = Limits(timeout_s=2.0, memory_mb=256)
    allowed_limits = Limits(timeout_s=2.0, memory_mb=256, allow_exec=True)
    with SandboxPool(workers=1, limits=denied_limits) as pool:
        denied, allowed = pool.run([Job(program, "f", [[7]]), Job(program, "f", [[7]], limits=allowed_limits)])
    assert denied.outputs[0].value == "PermissionError"
    assert allowed.outputs[0].value == "7\n"


SECCOMP_STATE = ("import os\n"
                 "def f():\n"
                 "    def field(pid, name):\n"
                 "        for line in open(f'/proc/{pid}/status'):\n"
                 "            if line.startswith(name + ':'):\n"
                 "                return int(line.split()[1])\n"
                 "    return [field('self', 'Seccomp_filters'), field(os.getppid(), 'Seccomp')]\n")


@pytest.mark.parametrize("isolation", ["auto", "fork"])
def test_a_job_runs_under_the_whole_filter_whether_the_worker_installed_it_or_the_job_did(isolation):
    """In bubblewrap the worker seals itself once and a job inherits the filter (adding the exec rule
    unless it may exec); without a pid namespace of its own the worker stays unfiltered and each job
    installs the whole filter itself."""
    limits = Limits(timeout_s=2.0, memory_mb=256)
    with SandboxPool(workers=1, limits=limits, isolation=isolation) as pool:
        if "seccomp" not in pool.isolation:
            pytest.skip(f"no seccomp on this machine ({pool.isolation})")
        sealed = pool.isolation.startswith("bwrap")
        denied, allowed = pool.run([Job(SECCOMP_STATE, "f", [[]]), Job(SECCOMP_STATE, "f", [[]], limits=Limits(
            timeout_s=2.0, memory_mb=256, allow_exec=True))])
    worker_mode = 2 if sealed else 0  # 2: SECCOMP_MODE_FILTER
    assert denied.outputs[0].value == [2 if sealed else 1, worker_mode]
    assert allowed.outputs[0].value == [1, worker_mode]
