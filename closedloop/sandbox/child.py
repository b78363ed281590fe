"""What runs inside a job's forked process: limits, compile, load, calls, canonical results.

Stdlib only, and no side effects at import: worker.py loads this file by path (the sandboxed program
must not find closedloop on sys.path), and the trusted side imports ``to_plain`` from it so both
sides agree on what a plain value is.

The child reports over the result pipe (fd 3) in lines: "ready" once it is confined (before any
program code runs), "loaded" once the program is loaded, then either one JSON result line holding
every call's outcome (batch jobs), or one line per call it reads from the call pipe (fd 4, for
interactive jobs whose calls the trusted grader makes one at a time) and a final line at its EOF.

A script job (empty entry point) has no calls: the program runs once as ``__main__``, and ends
cleanly when it runs to its end or raises SystemExit with code 0/None. A job that asks to collect
files adds ``"files": {relative path: text}`` to its ok result line: the tree of its job directory
once the program ran (see :func:`collect_files`), capped with the returned values.

Values cross the boundary in the codec below: JSON in which tuples, dicts, sets and non-finite floats
are tagged, built only from exact builtin types, so the trusted side rebuilds plain values and never
runs anything of the program's (no subclass, no custom ``__eq__``).
"""

import builtins
import errno
import json
import math
import os
import random
import re
import signal
import stat
import sys

RESULT_FD = 3  # the child's end of the result pipe, moved here so every other fd can be closed
CALL_FD = 4  # interactive jobs: the calls arrive here, one JSON line each
MAX_DEPTH = 100  # nesting allowed in returned values; deeper (or cyclic) values fail the call
ERROR_CHARS = 500  # cap on one error message
_MEMORY_LINE = b'{"status":"memory","error":"MemoryError","outputs":[]}\n'
# Object addresses in error messages differ between processes; masked so results stay deterministic.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
# What collect_files reports instead of the content of entries it does not read as text.
SYMLINK_MARKER = "<symlink to {target}>"  # never followed: the link itself is the program's output
SPECIAL_MARKER = "<not a regular file>"  # fifos, sockets, devices: opening one could block
UNREADABLE_MARKER = "<unreadable: {error}>"  # e.g. a directory the program made unreadable


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


def encode(value, depth=0):
    """``value`` in the tagged codec; exact builtin types only (a subclass of int is not an int)."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if depth >= MAX_DEPTH:
        raise ValueError(f"returned value nested deeper than {MAX_DEPTH} levels")
    if kind is list:
        return [encode(item, depth + 1) for item in value]
    if kind is tuple:
        return {"tuple": [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]}
    if kind is set or kind is frozenset:
        # Sorted by their JSON text, so the same set encodes the same way in every process.
        items = sorted((encode(item, depth + 1) for item in value), key=lambda e: json.dumps(e, sort_keys=True))
        return {kind.__name__: items}
    raise TypeError(f"returned non-plain value of type {kind.__name__}")


_SCALARS = (bool, int, str, float)


def decode(data):
    """The value ``encode`` produced ``data`` from; ValueError on anything it could not have produced."""
    kind = type(data)
    if data is None or kind in _SCALARS:
        return data
    if kind is list:
        return [decode(item) for item in data]
    if kind is dict and len(data) == 1:
        ((tag, body),) = data.items()
        try:
            if tag == "tuple" and type(body) is list:
                return tuple(decode(item) for item in body)
            if tag == "dict" and type(body) is list:
                return {decode(pair[0]): decode(pair[1]) for pair in body if _is_pair(pair)}
            if tag in ("set", "frozenset") and type(body) is list:
                items = (decode(item) for item in body)
                return set(items) if tag == "set" else frozenset(items)
            if tag == "float" and body in ("nan", "inf", "-inf"):
                return float(body)
        except TypeError as error:  # an unhashable key or set member
            raise ValueError(f"malformed encoded value: {error}") from None
    raise ValueError(f"malformed encoded value of type {kind.__name__}")


def _is_pair(pair):
    if type(pair) is not list or len(pair) != 2:
        raise ValueError("malformed encoded dict entry")
    return True


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


def _dumps(value):
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def _status_line(status, error):
    """A final result line for a job that did not answer every call."""
    return _dumps({"status": status, "error": error, "outputs": []}).encode() + b"\n"


def _outcome(function, args):
    """One call as its result line: [true, value, ""] or [false, null, "Error: message"]."""
    try:
        return '[true,' + _dumps(encode(function(*args))) + ',""]'
    except MemoryError:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit inside the function fails that call
        return _dumps([False, None, describe(exc)])


def _clean_exit(exc):
    """Whether a script's SystemExit ends it as the interpreter would with exit status 0."""
    code = exc.code
    return code is None or (type(code) in (int, bool) and code == 0)


def load_program(request, emit):
    """Compile and load the program; returns (entry point, None) or (None, final result line).

    A script job (empty entry point) returns (None, None) once the script ran to a clean end.
    """
    try:
        code = compile(request["program"], "<program>", "exec", dont_inherit=True)
    except MemoryError:
        return None, _MEMORY_LINE
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, but also null bytes or too deep nesting
        return None, _status_line("syntax_error", describe(exc))
    entry = request["entry_point"]
    namespace = {"__name__": "__program__" if entry else "__main__", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except MemoryError:
        return None, _MEMORY_LINE
    except SystemExit as exc:
        if entry or not _clean_exit(exc):  # a function job must not exit at load, even with 0
            return None, _status_line("load_error", describe(exc))
    except BaseException as exc:  # noqa: BLE001 - any exception at top level is a load error
        return None, _status_line("load_error", describe(exc))
    if not entry:
        emit(b"loaded\n")
        return None, None
    function = namespace.get(entry)
    if function is None or not callable(function):
        what = "is not defined" if function is None else "is not callable"
        error = f"NameError: entry point {entry!r} {what}"
        return None, _status_line("load_error", error)
    emit(b"loaded\n")
    return function, None


def run_program(request, emit, workdir=".", home_fd=None):
    """Batch jobs: load, make every call, return the final result line (bytes).

    The tree is collected from the job directory, reached through ``home_fd`` (opened before the
    program ran) where one is given: a program may chdir away, and the job's uid may not traverse the
    directories above its own (no bubblewrap: the pool's scratch directory is the worker's, mode 0700).
    """
    function, failure = load_program(request, emit)
    if failure is not None:
        return failure
    cap = request["limits"]["max_output_bytes"]
    try:
        parts = [_outcome(function, decode(args)) for args in request["calls"]]
    except MemoryError:
        return _MEMORY_LINE
    line = '{"status":"ok","error":"","outputs":[' + ",".join(parts) + "]"
    if len(line) > cap:
        return _status_line("output_limit", f"returned values exceed {cap} bytes of JSON")
    if request.get("collect_files"):
        root = workdir
        if home_fd is not None:
            try:
                os.fchdir(home_fd)
                root = "."
            except OSError:  # the program closed it: fall back to the path
                pass
        try:
            files = collect_files(root, cap - len(line))
        except MemoryError:
            return _MEMORY_LINE
        if files is None:
            return _status_line("output_limit", f"returned values and files exceed {cap} bytes of JSON")
        line += ',"files":' + _dumps(files)
        if len(line) > cap:
            return _status_line("output_limit", f"returned values and files exceed {cap} bytes of JSON")
    return (line + "}\n").encode()


def _text(raw):
    """Bytes (file content, or a name from the file system) as text; non-UTF-8 bytes as \\xNN."""
    return raw.decode("utf-8", errors="backslashreplace")


def _read_regular(path, budget):
    """A regular file's bytes (at most ``budget`` + 1), a marker if it is not one, without following links."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return UNREADABLE_MARKER.format(error=type(exc).__name__)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the directory was listed
            return SPECIAL_MARKER
        chunks, size = [], 0
        while size <= budget:
            chunk = os.read(fd, budget + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return _text(b"".join(chunks))
    except OSError as exc:
        return UNREADABLE_MARKER.format(error=type(exc).__name__)
    finally:
        os.close(fd)


def collect_files(root, budget):
    """The files under ``root`` as {relative "/"-separated path: text}, sorted; None past ``budget`` bytes.

    Files only: directories are implied by the paths, so an empty one is not reported. Nothing is
    followed or opened that could block: a symlink, fifo, socket or device, and an entry that cannot
    be read, is reported by a marker instead of its content (an unreadable directory under its own
    path). The budget counts names and contents roughly as the JSON will, so a tree far over the cap
    stops the walk early instead of being read whole.
    """
    files = {}
    used = 0
    pending = [""]  # relative paths of the directories still to list; iterative, so depth is no risk
    while pending:
        relative = pending.pop()
        try:
            with os.scandir(os.path.join(root, relative) if relative else root) as listing:
                entries = [(entry.name, entry.is_symlink(), entry.is_dir(follow_symlinks=False),
                            entry.is_file(follow_symlinks=False)) for entry in listing]
        except OSError as exc:
            entries = None
            files[relative or "."] = UNREADABLE_MARKER.format(error=type(exc).__name__)
        for name, is_link, is_dir, is_file in entries or ():
            path = f"{relative}/{name}" if relative else name
            full = os.path.join(root, path)
            if is_dir:
                pending.append(path)
                continue
            if is_link:
                try:
                    content = SYMLINK_MARKER.format(target=_text(os.fsencode(os.readlink(full))))
                except OSError as exc:
                    content = UNREADABLE_MARKER.format(error=type(exc).__name__)
            elif is_file:
                content = _read_regular(full, budget - used)
            else:
                content = SPECIAL_MARKER
            key = _text(os.fsencode(path))
            files[key] = content
            used += len(key) + len(content) + 6  # quotes, colon, comma; escapes only make it longer
            if used > budget:
                return None
    return dict(sorted(files.items()))


def _call_lines(fd):
    """The lines arriving on ``fd`` until EOF."""
    pending = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from lines


def run_interactive(request, emit):
    """Interactive jobs: load, then answer each call line on CALL_FD until EOF; returns the final line."""
    function, failure = load_program(request, emit)
    if function is None:  # Job allows no script (empty entry point) with a test program
        return failure or _status_line("load_error", "NameError: an interactive job needs an entry point")
    cap = request["limits"]["max_output_bytes"]
    if request["calls"]:  # the calls the trusted test is known to make: answered in one line
        try:
            batch = "[" + ",".join(_outcome(function, decode(args)) for args in request["calls"]) + "]"
        except MemoryError:
            return _MEMORY_LINE
        if len(batch) > cap:
            error = f"returned values exceed {cap} bytes of JSON"
            return _status_line("output_limit", error)
        emit(batch.encode() + b"\n")
    for line in _call_lines(CALL_FD):
        try:
            reply = _outcome(function, decode(json.loads(line)))
        except MemoryError:
            return _MEMORY_LINE
        if len(reply) > cap:
            error = f"returned values exceed {cap} bytes of JSON"
            return _status_line("output_limit", error)
        emit(reply.encode() + b"\n")
    return b'{"status":"ok","error":"","outputs":[]}\n'


# Written on the result pipe by any process of the job (forks inherit fd 3) when a process or thread
# could not start: RLIMIT_NPROC stopped it. The worker then fails the job with status process_limit,
# whatever the program returned, since a program that catches the error could still answer right.
PROCESS_LIMIT_MARKER = b"limit:processes\n"


def _hit_process_limit(exc):
    """Whether ``exc`` is what a fork or thread start raises at RLIMIT_NPROC (EAGAIN; threads: RuntimeError)."""
    if isinstance(exc, OSError):
        return exc.errno == errno.EAGAIN
    return isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)


def _reporting(start):
    def guarded(*args, **kwargs):
        try:
            return start(*args, **kwargs)
        except (OSError, RuntimeError) as exc:
            if _hit_process_limit(exc):
                try:
                    os.write(RESULT_FD, PROCESS_LIMIT_MARKER)
                except OSError:  # the program closed the pipe: it reports nothing at all, which fails it too
                    pass
            raise
    guarded.__name__ = getattr(start, "__name__", "start")
    return guarded


def guard_process_limits():
    """Report a process or thread start that RLIMIT_NPROC refused, even if the program catches it.

    Every way a Python program starts a process or thread in the job (os, posix, subprocess's and
    threading's own references to the C functions) goes through a wrapper that writes
    PROCESS_LIMIT_MARKER before re-raising. Only this job's forked process is patched.
    """
    import _thread
    import posix

    for module in (os, posix):
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            if hasattr(module, name):
                setattr(module, name, _reporting(getattr(module, name)))
    _thread.start_new_thread = _thread.start_new = _reporting(_thread.start_new_thread)
    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = _reporting(_posixsubprocess.fork_exec)
    except ImportError:
        pass
    if "threading" in sys.modules:  # it keeps its own reference to start_new_thread
        sys.modules["threading"]._start_new_thread = _thread.start_new_thread
    if "subprocess" in sys.modules and getattr(sys.modules["subprocess"], "_fork_exec", None) is not None:
        sys.modules["subprocess"]._fork_exec = sys.modules["_posixsubprocess"].fork_exec


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _place_files(files):
    for relative, text in files.items():
        folder = os.path.dirname(relative)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(relative, "w", encoding="utf-8") as handle:
            handle.write(text)


def run_child(request, fds, workdir, jail, measures):
    """The forked job process: confine, run, report, and always end in os._exit.

    ``fds`` maps the child's fd numbers (0-4) to the worker's: stdin, stdout, stderr, result, calls.
    """
    try:
        os.setsid()  # own session and process group: the worker kills the whole group at the end
        os.chdir(workdir)
        for target, source in sorted(fds.items()):
            os.dup2(source, target)
        os.closerange(max(fds) + 1, 1 << 16)  # the worker's protocol pipes above all
        home_fd = os.open(".", os.O_RDONLY)  # the job directory, to collect its files from (run_program)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; we want the kill
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the worker ignores it
        # `random` is imported by the worker already; a fixed seed keeps programs that use it
        # deterministic, as PYTHONHASHSEED=0 does for set and dict iteration order.
        random.seed(0)
        limits = request["limits"]
        jail.confine(measures, limits, request.get("allow_exec", False))
        guard_process_limits()
        _place_files(request.get("files") or {})
        sys.stdin, sys.stdout, sys.stderr = _streams or _make_streams()
        out, err = sys.stdout, sys.stderr
        write_all(RESULT_FD, b"ready\n")
        emit = lambda data: write_all(RESULT_FD, data)  # noqa: E731
        if request.get("interactive"):
            line = run_interactive(request, emit)
        else:
            line = run_program(request, emit, os.path.abspath(workdir), home_fd)
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


_streams = None


def _make_streams():
    """Text streams on fds 0, 1 and 2, whatever those fds will point to (~0.5 ms to create)."""
    return (open(0, encoding="utf-8", closefd=False),
            open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False),
            open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False))


def warm_up():
    """Run the child's code path once in the worker itself.

    The first compile() in a process initialises parser state (~2 ms, measured); done here, every
    forked child inherits it instead of paying it again on copy-on-write pages. The job's text
    streams are made here too: they refer to fd numbers, which the child points at its own files.
    """
    global _streams
    _streams = _make_streams()
    program = "def f(x):\n    return [x, (x,), {'k': 1.5}, str(x)]\n"
    request = {"program": program, "entry_point": "f", "calls": [[1], ["a"]], "limits": {"max_output_bytes": 65536}}
    run_program(request, lambda data: None)
