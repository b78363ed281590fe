"""How a worker process is started: inside bubblewrap where this machine allows it, else bare.

Inside bubblewrap a worker sees only what a Python program needs: the system directories and the
interpreter's own prefix, read-only; this package's folder (the worker's code, nothing of the
grader's or the tests'), read-only; a fresh /proc and /dev; and a size-capped private tmpfs at /tmp
where its job directories live. It gets new pid, net, ipc and uts namespaces (so no network at
all, not even loopback), its own session, and dies with the pool.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from closedloop.io import say

SANDBOX_DIR = Path(__file__).resolve().parent
_MOUNT_POINT = "/opt/closedloop-sandbox"
# Capabilities the worker keeps (when started as root): to hand each job directory to the job's uid,
# drop the job to it, clean up after it, and kill what it left. A job keeps none of them.
_WORKER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL")
_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32")


def _interpreter() -> str:
    return os.path.realpath(sys.executable)


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]  # merged /usr: /bin -> usr/bin
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _python_binds() -> list[str]:
    """The interpreter's prefix and site-packages, where they lie outside the system folders.

    Emitted after the private /tmp is mounted: a checkout or virtual environment under /tmp (a CI
    clone, a temp workspace) would otherwise be hidden by that tmpfs.
    """
    args: list[str] = []
    prefix = os.path.realpath(sys.base_prefix)
    trees = [] if any(prefix == d or prefix.startswith(d + "/") for d in _SYSTEM_DIRS) else [prefix]
    # A virtual environment's site-packages lie outside the base prefix.
    trees += [site for site in site_dirs() if not (site == prefix or site.startswith(prefix + "/"))]
    interpreter_dir = os.path.dirname(_interpreter())
    if not interpreter_dir.startswith(prefix + "/"):
        trees.append(interpreter_dir)
    for tree in trees:
        # e.g. a pyenv build under /root: bubblewrap would copy /root's mode 0700 onto the folders it
        # makes on the way, and the job's uid could not import any module not preloaded.
        for parent in reversed([str(p) for p in Path(tree).parents if str(p) not in ("/", "/tmp")]):
            args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", tree, tree]
    return args


def site_dirs() -> list[str]:
    """The running interpreter's site-packages: where preloaded libraries (pandas for the data env) live.
    Workers start with -S, so these are put on their sys.path explicitly (after the stdlib)."""
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths[key]) for key in ("purelib", "platlib") if os.path.isdir(paths[key])})


def bwrap_argv(disk_mb: int) -> list[str]:
    """The bubblewrap command line that precedes the worker's own (``python ... worker.py``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", *_system_binds(),
            "--ro-bind", str(SANDBOX_DIR), _MOUNT_POINT,
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(disk_mb << 20), "--tmpfs", "/tmp", *_python_binds(), "--chdir", "/tmp"]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"] + [arg for cap in _WORKER_CAPS for arg in ("--cap-add", cap)]
    return argv


def worker_argv(use_bwrap: bool, disk_mb: int, scratch: Path, config: str) -> list[str]:
    """The full command that starts one worker; the scratch dir is /tmp inside bubblewrap."""
    python = [_interpreter(), "-s", "-S", "-B"]
    if use_bwrap:
        return bwrap_argv(disk_mb) + python + [f"{_MOUNT_POINT}/worker.py", "/tmp", config]
    return python + [str(SANDBOX_DIR / "worker.py"), str(scratch), config]


@functools.lru_cache(maxsize=1)
def bwrap_works() -> tuple[bool, str]:
    """(whether bubblewrap can start a worker here, why not): tried once per process, for real."""
    try:
        argv = bwrap_argv(1) + [_interpreter(), "-S", "-c", "import os; os.listdir('/tmp')"]
    except FileNotFoundError:
        return False, "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, env={"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"bubblewrap failed to start: {error}"
    if done.returncode != 0:
        return False, f"bubblewrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()[:200]}"
    return True, ""


_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        say(f"closedloop: sandbox: {message}")
