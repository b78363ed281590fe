"""What runs inside a job's forked process: limits, compile, load, calls, canonical results.

Stdlib only, and no side effects at import: worker.py loads this file by path (the sandboxed program
must not find closedloop on sys.path), and the trusted side imports ``to_plain`` from it so both
sides agree on what a plain value is.

The child reports over the result pipe (fd 3) in lines: "ready" once its limits are set (before any
program code runs), "loaded" once the program is loaded, then one JSON result line.
"""

import builtins
import json
import math
import os
import random
import re
import resource
import signal
import sys

RESULT_FD = 3  # the child's end of the result pipe, moved here so every other fd can be closed
MAX_DEPTH = 100  # nesting allowed in returned values; deeper (or cyclic) values fail the call
ERROR_CHARS = 500  # cap on one error message
_MEMORY_LINE = b'{"status":"memory","error":"MemoryError","outputs":[]}\n'
# Object addresses in error messages differ between processes; masked so results stay deterministic.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


# ---------------------------------------------------------------------------------------------
# Canonical values (also imported by the trusted side, so both agree on what "plain" means)


def to_plain(value, depth=0):
    """``value`` as canonical JSON data, accepting only exact plain types.

    Exact types, not isinstance: an ``int`` subclass with a custom ``__eq__`` must not pass for an int.
    Tuples become lists (JSON has no tuples); dict keys must be str.
    """
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"returned non-finite float {value!r}")
        return value
    if kind is list or kind is tuple or kind is dict:
        if depth >= MAX_DEPTH:
            raise ValueError(f"returned value nested deeper than {MAX_DEPTH} levels")
        if kind is dict:
            plain = {}
            for key, item in dict.items(value):
                if type(key) is not str:
                    raise TypeError(f"returned dict with non-str key of type {type(key).__name__}")
                plain[key] = to_plain(item, depth + 1)
            return plain
        return [to_plain(item, depth + 1) for item in value]
    raise TypeError(f"returned non-plain value of type {kind.__name__}")


def describe(exc):
    """"TypeError: message" for any exception, robust to hostile __str__ implementations."""
    try:
        name = type(exc).__name__
        if isinstance(exc, SyntaxError):
            text = f"{name}: {exc.msg} (line {exc.lineno})"
        else:
            message = str(exc)
            text = f"{name}: {message}" if message else name
    except BaseException:  # noqa: BLE001 - a program's exception may raise from __str__
        text = "exception with an unprintable message"
    return _ADDRESS.sub("0x…", text)[:ERROR_CHARS]


# ---------------------------------------------------------------------------------------------
# The job process (run_program also runs once in the worker, to warm it up)


def _set_limit(which, soft, hard=None):
    _, current_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        # An unprivileged process may lower its hard limit but never raise it.
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))


def run_program(request, emit):
    """Compile, load and call; returns the final result line (bytes). Runs under the rlimits."""
    dumps = json.dumps  # bound before the program runs, so rebinding json.dumps has no effect here
    limits = request["limits"]
    try:
        code = compile(request["program"], "<program>", "exec", dont_inherit=True)
    except MemoryError:
        return _MEMORY_LINE
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, but also null bytes or too deep nesting
        return dumps({"status": "syntax_error", "error": describe(exc), "outputs": []}).encode() + b"\n"
    namespace = {"__name__": "__program__", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except MemoryError:
        return _MEMORY_LINE
    except BaseException as exc:  # noqa: BLE001 - SystemExit at top level is a load error too
        return dumps({"status": "load_error", "error": describe(exc), "outputs": []}).encode() + b"\n"
    entry = request["entry_point"]
    function = namespace.get(entry)
    if function is None or not callable(function):
        what = "is not defined" if function is None else "is not callable"
        error = f"NameError: entry point {entry!r} {what}"
        return dumps({"status": "load_error", "error": error, "outputs": []}).encode() + b"\n"
    emit(b"loaded\n")
    parts = []
    for args in request["calls"]:
        try:
            encoded = dumps(to_plain(function(*args)), allow_nan=False, separators=(",", ":"))
            parts.append('[true,' + encoded + ',""]')
        except MemoryError:
            return _MEMORY_LINE
        except BaseException as exc:  # noqa: BLE001 - SystemExit inside the function fails that call
            parts.append(dumps([False, None, describe(exc)]))
    line = ('{"status":"ok","error":"","outputs":[' + ",".join(parts) + "]}\n").encode()
    if len(line) > limits["max_output_bytes"]:
        error = f"returned values exceed {limits['max_output_bytes']} bytes of JSON"
        return dumps({"status": "output_limit", "error": error, "outputs": []}).encode() + b"\n"
    return line


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def run_child(request, result_w, out_fd, err_fd, workdir):
    """The forked job process: isolate, limit, run, report, and always end in os._exit."""
    try:
        os.setsid()  # own session and process group: the worker kills the whole group at the end
        os.chdir(workdir)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.dup2(result_w, RESULT_FD)
        os.closerange(RESULT_FD + 1, 1 << 16)  # the worker's protocol pipes above all
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; we want the kill
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the worker ignores it
        # `random` is imported by the worker already; a fixed seed keeps programs that use it
        # deterministic, as PYTHONHASHSEED=0 does for set and dict iteration order.
        random.seed(0)
        limits = request["limits"]
        cpu = int(math.ceil(limits["timeout_s"])) + 1
        _set_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
        _set_limit(resource.RLIMIT_FSIZE, limits["max_output_bytes"])
        _set_limit(resource.RLIMIT_NOFILE, 64)
        _set_limit(resource.RLIMIT_CORE, 0)
        _set_limit(resource.RLIMIT_AS, limits["memory_mb"] << 20)
        out = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        err = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin, sys.stdout, sys.stderr = open(0, closefd=False), out, err
        write_all(RESULT_FD, b"ready\n")
        line = run_program(request, lambda data: write_all(RESULT_FD, data))
        # Flush before reporting: output over the cap raises SIGXFSZ here, and the worker maps
        # that signal to output_limit instead of trusting a result written before it.
        out.flush()
        err.flush()
        write_all(RESULT_FD, line)
    except MemoryError:
        try:
            write_all(RESULT_FD, _MEMORY_LINE)
        except BaseException:  # noqa: BLE001 - nothing left to do but exit
            pass
    except BaseException:  # noqa: BLE001 - no result line: the worker reports how the child ended
        pass
    finally:
        os._exit(0)


def warm_up():
    """Run the child's code path once in the worker itself.

    The first compile() in a process initialises parser state (~2 ms, measured); done here, every
    forked child inherits it instead of paying it again on copy-on-write pages.
    """
    program = "def f(x):\n    return [x, (x,), {'k': 1.5}, str(x)]\n"
    request = {"program": program, "entry_point": "f", "calls": [[1], ["a"]], "limits": {"max_output_bytes": 65536}}
    run_program(request, lambda data: None)
