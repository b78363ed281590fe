"""The trusted side of judging a job: value comparison and assert-style test programs.

Nothing here ever holds an object the sandboxed program made: values arrive as plain data and are
rebuilt from exact builtin types (see child.decode), so a returned object cannot override ``__eq__``,
and the expected values and the tests never enter the sandboxed process.

A test program in HumanEval's format defines ``check(candidate)``. It runs here, after a trusted
prelude (HumanEval's prompt, which defines helpers such as ``poly`` that the tests use), with
``candidate`` forwarding each call to the job process. Every ``assert`` in ``check`` is rewritten to
count instead of stop, so a job earns partial credit per assert; runs of consecutive top-level
asserts are shuffled per job, so a program cannot answer by call order.
"""

from __future__ import annotations

import ast
import copy
import gc
import json
import math
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from closedloop.sandbox.child import encode

_COUNTER = "__closedloop_count__"
ORDERS_PER_TEST = 8


def same_value(expected: Any, got: Any) -> bool:
    """Exact-type equality; floats allow 1e-9, bools never equal ints.

    Expected lists also accept tuples: task files are JSON, which cannot hold a tuple.
    """
    kind = type(expected)
    if kind is float:
        if type(got) not in (int, float):
            return False
        return (math.isnan(expected) and math.isnan(got)) or math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
    if kind is list and type(got) is tuple:
        got = list(got)
    if kind is not type(got):
        return False
    if kind is list or kind is tuple:
        return len(expected) == len(got) and all(same_value(e, g) for e, g in zip(expected, got))
    if kind is dict:
        return expected.keys() == got.keys() and all(same_value(expected[k], got[k]) for k in expected)
    return expected == got


class JobOver(BaseException):
    """Raised by the candidate proxy once the job process is gone; not an Exception, so a test's
    ``except Exception`` cannot swallow it."""


class CandidateError(Exception):
    """The sandboxed call raised; carries its "Type: message"."""


class _Counter:
    def __init__(self) -> None:
        self.passed = 0
        self.total = 0
        self.first_failure = ""

    def __call__(self, ok: bool, line: int, error: BaseException | None) -> None:
        self.total += 1
        if ok:
            self.passed += 1
        elif not self.first_failure:
            detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            self.first_failure = f"test line {line}: {detail}"[:500]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Parsing builds thousands of AST objects, enough to set off the garbage collector's full passes
    over every object the process holds: 40% of a test's parse time, measured."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _count_asserts(statements: list[ast.stmt]) -> list[ast.stmt]:
    """Every ``assert`` among ``statements`` and the statements nested in them, made to count.

    ``assert x, m`` → try: assert x, m / except Exception as e: count(False) / else: count(True).
    Asserts are statements, so only statement lists are walked: the tests' large literal arguments,
    most of a HumanEval test's nodes, are never visited.
    """
    out = []
    for node in statements:
        if isinstance(node, ast.Assert):
            out.append(_counted(node))
            continue
        for field in ("body", "orelse", "finalbody"):
            nested = getattr(node, field, None)
            if isinstance(nested, list) and nested and isinstance(nested[0], ast.stmt):
                setattr(node, field, _count_asserts(nested))
        for part in getattr(node, "handlers", []) + getattr(node, "cases", []):
            part.body = _count_asserts(part.body)
        out.append(node)
    return out


def _counted(node: ast.Assert) -> ast.Try:
    where = {key: getattr(node, key) for key in ("lineno", "col_offset", "end_lineno", "end_col_offset")}

    def count(*args: ast.expr) -> ast.Expr:
        return ast.Expr(ast.Call(ast.Name(_COUNTER, ast.Load(), **where), list(args), [], **where), **where)

    line = ast.Constant(node.lineno, **where)
    error = "__closedloop_error__"
    handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load(), **where), name=error,
                                body=[count(ast.Constant(False, **where), line, ast.Name(error, ast.Load(), **where))],
                                **where)
    return ast.Try(body=[node], handlers=[handler], orelse=[count(ast.Constant(True, **where), line,
                                                                   ast.Constant(None, **where))],
                   finalbody=[], **where)


@dataclass
class TestVerdict:
    passed: int
    total: int
    completed: bool  # check() returned (it did not raise outside an assert)
    error: str


class TestProgram:
    """A trusted test program, parsed once and run once per job."""

    def __init__(self, prelude: str, test: str, source_name: str = "<test>") -> None:
        with _collector_paused():
            self._parse(prelude, test, source_name)

    def _parse(self, prelude: str, test: str, source_name: str) -> None:
        self.prelude = compile(prelude, f"{source_name}:prelude", "exec") if prelude.strip() else None
        tree = ast.parse(test, f"{source_name}")
        self.check_index = None
        for index, node in enumerate(tree.body):
            if isinstance(node, ast.FunctionDef) and node.name == "check":
                self.check_index = index
        if self.check_index is None:
            raise ValueError(f"{source_name}: the test program defines no check(candidate) function")
        self.source_name = source_name
        self._variants: dict[int, Any] = {}
        check = tree.body[self.check_index]
        self.static_calls = _static_calls(check)
        # Rewritten once; each order only reshuffles check's top-level statements (compile() reads
        # the tree without changing it, so the orders share every node).
        top_level_asserts = [isinstance(node, ast.Assert) for node in check.body]
        tree.body = _count_asserts(tree.body)
        self.tree = tree
        self._check_body = list(zip(check.body, top_level_asserts))

    def _compiled(self, seed: int):
        # A few orders per test, each compiled once: parsing and compiling a test costs more than
        # running a job, and the program cannot tell which of the orders it is given.
        variant = seed % ORDERS_PER_TEST
        if variant not in self._variants:
            self._variants[variant] = self._compile(variant)
        return self._variants[variant]

    def _compile(self, seed: int):
        check = copy.copy(self.tree.body[self.check_index])
        check.body = _shuffle_assert_runs(self._check_body, random.Random(seed))
        body = list(self.tree.body)
        body[self.check_index] = check
        return compile(ast.Module(body=body, type_ignores=[]), self.source_name, "exec")

    def run(self, candidate: Callable[..., Any], seed: int, entry_point: str = "") -> TestVerdict:
        namespace: dict[str, Any] = {"__name__": "__closedloop_test__"}
        counter = _Counter()
        try:
            if self.prelude is not None:
                exec(self.prelude, namespace)  # noqa: S102 - the task set's own prompt, trusted
            if entry_point:
                # Some tests call the function by its own name (HumanEval/33 compares candidate(x)
                # with sort_third(x)); in the original harness that name is the completion's function.
                namespace[entry_point] = candidate
            namespace[_COUNTER] = counter
            exec(self._compiled(seed), namespace)  # noqa: S102 - the task set's own tests, trusted
            namespace["check"](candidate)
        except JobOver:
            raise
        except Exception as error:  # noqa: BLE001 - a test that stops outside an assert fails the job
            detail = f"{type(error).__name__}: {error}"[:500]
            return TestVerdict(counter.passed, counter.total, False, counter.first_failure or detail)
        return TestVerdict(counter.passed, counter.total, True, counter.first_failure)


def _static_calls(check: ast.FunctionDef) -> list[list]:
    """The distinct argument lists of ``candidate(<literals>)`` calls in ``check``, in source order.

    They are sent with the job and answered in one batch, so only calls whose arguments are computed
    at run time cost a round trip each.
    """
    if not check.args.args:
        return []
    name = check.args.args[0].arg
    found: dict[str, list] = {}
    for node in ast.walk(check):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
                and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)):
            try:
                args = [ast.literal_eval(a) for a in node.args]
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            try:
                found.setdefault(call_key(encode(args)), args)
            except (TypeError, ValueError):
                continue
    return list(found.values())


def call_key(encoded_args: list) -> str:
    """The identity of a call's (encoded) arguments, as the candidate proxy looks them up."""
    return json.dumps(encoded_args, sort_keys=True)


def _shuffle_assert_runs(body: list[tuple[ast.stmt, bool]], rng: random.Random) -> list[ast.stmt]:
    """The statements with each run of consecutive (rewritten) top-level asserts shuffled in place."""
    out: list[ast.stmt] = []
    run: list[ast.stmt] = []
    for node, is_assert in body + [(None, False)]:  # type: ignore[list-item]
        if is_assert:
            run.append(node)
            continue
        rng.shuffle(run)
        out.extend(run)
        run = []
        if node is not None:
            out.append(node)
    return out
