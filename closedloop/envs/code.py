"""The code environment: write a short Python function from a one-line spec; hidden tests judge it.

Generation is trusted: expected outputs come from executing the generator's own reference in this
process. Model completions only ever run in the sandbox, and their outputs are compared here. The
program a completion makes is prompt + completion; a chat reply's (a fenced block, a restated def) is
read by envs/extraction.py first, and the verdict's steps then start with ``extract``.

In an episode (envs/episodes.py) the first ``checks.visible`` calls are the visible checks (default:
half the calls, at least one) and the rest hidden; a task of one call holds nothing back. The model
may read a failing visible call with its returned and expected value, or the exception's last line.
A HumanEval-format test program cannot be split: it is verified whole, and the model reads only the
status and the exception's type, never the test's assertion text.

Splits are disjoint by construction: a task belongs to the benchmark iff the hash of its *behaviour*
(the reference's outputs on a fixed probe set) falls in a fixed bucket, so train can never emit a
benchmark task, nor a differently worded task that computes the same function.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypedDict

from closedloop.envs import extraction
from closedloop.envs.base import (
    HELDOUT,
    BaseEnvironment,
    Task,
    Verdict,
    check_split,
    draw_until,
    not_judged,
    round_robin,
    source_of,
)
from closedloop.envs.code_tasks import FAMILIES, edge_inputs, is_failure_mode, is_heldout, probe_inputs
from closedloop.envs.episodes import between, error_line, exception_type, status_only
from closedloop.envs.extraction import Extraction, extract_program
from closedloop.envs.humaneval import program_job
from closedloop.envs.taskfile import shape_problems
from closedloop.sandbox.child import to_plain
from closedloop.sandbox.records import ExecResult, Job

if TYPE_CHECKING:
    from closedloop.config import CodeEnvParams
    from closedloop.sandbox.pool import SandboxPool

BENCHMARK_PER_MILLE = 150  # share of all task behaviours reserved for the benchmark
ENTRY_POINT = "f"
_REPR_CHARS = 120


class _Calls(TypedDict):
    calls: list[list[Any]]  # positional arguments, one list per call
    expected: list[Any]  # the reference's return value per call


# The optional field by inheritance, not NotRequired: under `from __future__ import annotations`
# a TypedDict takes a NotRequired field for a required one (its annotation is a string).
class CallsChecks(_Calls, total=False):
    """A generated task's checks (what _job reads): the sandbox calls the function, the trusted side compares."""

    visible: int  # episodes: how many leading calls the model is shown; the rest are hidden (default: half, at least 1)


class HumanEvalChecks(TypedDict):
    """A HumanEval-format task's checks."""

    test: str  # a program defining check(candidate), run on the trusted side


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


def behaviour_hash(params: str, function: Any) -> str:
    """What a function computes, as a hash: its outputs on the fixed probe inputs of its signature."""
    return _hash([params, [to_plain(function(*args)) for args in probe_inputs(params)]])


def in_benchmark(behaviour: str) -> bool:
    """The split of a behaviour: a fixed bucket of the hash space, whatever the seeds."""
    return int(behaviour[:8], 16) % 1000 < BENCHMARK_PER_MILLE


COMPONENTS = ("syntax", "runs", "tests_passed")
STEPS = ("parses", "runs", "tests_passed")


def in_edge_slice(behaviour: str) -> bool:
    """Benchmark behaviours tested on edge inputs: a fixed quarter, so no prompt is in two slices."""
    return int(behaviour[8:12], 16) % 4 == 0


class CodeEnv(BaseEnvironment):
    name = "code"
    uses_sandbox = True
    sandbox_preload: tuple[str, ...] = ()
    components = COMPONENTS
    # Process supervision: a completion that parses and runs scores above one that does not parse,
    # but only passing tests earn most of the reward.
    default_weights = {"syntax": 0.1, "runs": 0.1, "tests_passed": 0.8}

    def __init__(self, params: CodeEnvParams) -> None:
        self.params = params

    def component_sources(self) -> dict[str, tuple[Any, Any]]:
        config = {"tests_per_task": self.params.tests_per_task, "sandbox": self.params.sandbox.model_dump(mode="json"),
                  "extraction": extraction.version(), "credit": source_of(tests_credit)}
        return {"syntax": (_judge, config), "runs": (_judge, config), "tests_passed": (_judge, config)}

    # -- generation ------------------------------------------------------------------------------

    def generate(self, n: int, seed: int, split: str, slice: str = "core") -> list[Task]:
        """``n`` distinct tasks of ``split``, the same for the same arguments; kinds in round robin.

        Train mixes every spec (tagged core or failure_modes). The benchmark's ``core`` slice holds
        the ordinary specs, ``failure_modes`` the shapes small models get wrong, and ``edge`` any spec
        tested mostly on edge inputs. ``heldout`` holds the compositions train never emits
        (code_tasks.is_heldout), drawn from their whole space: no train task computes one.
        """
        check_split(self.name, split, slice, n)
        slice = "core" if split == "train" else slice
        rng = random.Random(f"code/{split}/{seed}" + ("" if slice == "core" else f"/{slice}"))
        kinds = [kind for kind in FAMILIES if slice != HELDOUT or kind in ("transform", "reduce")]
        seen: set[str] = set()  # behaviour hashes: two tasks computing the same function are duplicates
        return round_robin(self.name, kinds, n, lambda kind: self._draw(kind, rng, split, slice, seen),
                           split=split, slice=slice)

    def _draw(self, kind: str, rng: random.Random, split: str, slice: str, seen: set[str]) -> Task | None:
        def attempt() -> Task | None:
            spec = FAMILIES[kind].sample(rng)
            if is_heldout(spec) != (slice == HELDOUT):
                return None
            if split == "benchmark" and slice in ("core", "failure_modes") and is_failure_mode(spec) != (slice == "failure_modes"):
                return None
            behaviour, task = self._build(spec, split, slice)
            if task is None or behaviour in seen:
                return None
            seen.add(behaviour)
            return task

        return draw_until(attempt)

    def _build(self, spec: tuple, split: str, slice: str = "core") -> tuple[str, Task | None]:
        """(behaviour hash, the task) for ``spec``; the task is None when it belongs to the other split."""
        family = FAMILIES[spec[0]]
        comment, expression = family.render(spec)
        prompt = f"# {comment}\ndef {ENTRY_POINT}({family.params}):\n"
        reference = f"    return {expression}\n"
        function = _load_trusted(prompt + reference)
        behaviour = behaviour_hash(family.params, function)
        if slice == HELDOUT:
            pass  # never trained on: the whole space of the compositions is the benchmark's
        elif in_benchmark(behaviour) != (split == "benchmark"):
            return behaviour, None
        elif split == "benchmark" and in_edge_slice(behaviour) != (slice == "edge"):
            return behaviour, None  # benchmark slices never share a function
        spec_hash = _hash(list(spec))
        draw_inputs = edge_inputs if slice == "edge" else family.inputs
        calls = draw_inputs(spec, random.Random(spec_hash), self.params.tests_per_task)
        expected = [to_plain(function(*json.loads(json.dumps(args)))) for args in calls]
        task = Task(
            task_id=f"code/{split}/{spec_hash[:10]}" if slice not in ("edge", HELDOUT) else f"code/{split}/{slice}/{spec_hash[:10]}",
            env=self.name,
            split=split,
            slice="failure_modes" if slice not in ("edge", HELDOUT) and is_failure_mode(spec) else slice,
            kind=family.kind,
            prompt=prompt,
            entry_point=ENTRY_POINT,
            checks={"calls": calls, "expected": expected},
            reference=reference,
        )
        return behaviour, task

    @staticmethod
    def check_task(task: Task) -> list[str]:
        """What is wrong with a task from a file: its entry point, and calls with expected values (and
        ``visible``, from 1 to their number) or a test."""
        problems = [] if task.entry_point.isidentifier() else [
            f"field 'entry_point' must name the function to call, got {task.entry_point!r}"]
        if "test" in task.checks:
            found = shape_problems(task.checks, HumanEvalChecks, "checks")
            if not found and "def check(" not in task.checks["test"]:
                found = ["checks.test must define check(candidate)"]
            if not found and "visible" in task.checks:
                found = ["checks.visible splits calls; a test program (checks.test) is verified whole"]
            return problems + found
        found = shape_problems(task.checks, CallsChecks, "checks")
        found = [p + " (or give 'test', a check(candidate) program)" if p == "checks is missing 'calls'" else p
                 for p in found]
        if not found and not task.checks["calls"]:
            found = ["checks.calls must hold at least one call"]
        elif not found and len(task.checks["expected"]) != len(task.checks["calls"]):
            found = [f"checks.expected must hold one value per call ({len(task.checks['calls'])}), "
                     f"got {len(task.checks['expected'])}"]
        elif not found and "visible" in task.checks:
            found = visible_problems(task.checks)
        return problems + found

    # -- episodes (envs/episodes.py) -------------------------------------------------------------

    def split_checks(self, task: Task) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(visible, hidden): the first ``checks.visible`` calls and the rest; None when no call is left
        hidden. A test program cannot be split: the same checks both ways, its assertions never shown.
        The visible part says all its calls are visible, so splitting it again gives it back whole."""
        checks = task.checks
        if "test" in checks:
            return checks, checks
        count = visible_calls(checks)
        if count >= len(checks["calls"]):
            return None
        calls, expected = checks["calls"], checks["expected"]
        hidden = {key: value for key, value in checks.items() if key != "visible"}
        return ({**checks, "calls": calls[:count], "expected": expected[:count], "visible": count},
                {**hidden, "calls": calls[count:], "expected": expected[count:]})

    def shown_feedback(self, task: Task, verdict: Verdict) -> str:
        """A failing visible call with its returned and expected value, or what it raised; a program
        that did not load or hit a limit, the error's last line. A test program's status and exception
        type only. Anything else: the status and failed step."""
        if verdict.passed:
            return f"passed the visible checks: all {verdict.steps.get('tests_total')} tests"
        if verdict.failed_step == "extract":
            return verdict.feedback  # says how the reply was read: nothing of the checks
        if "test" in task.checks:
            if verdict.status in ("failed", "runtime_error"):  # the test's words may quote what it expects
                kind = exception_type(verdict.feedback.replace("CandidateError: ", "", 1))  # the candidate's own
                return f"{status_only(verdict)}: {kind}" if kind else status_only(verdict)
            return f"{status_only(verdict)}: {error_line(verdict.feedback)}"  # a syntax error, a limit
        if not verdict.feedback.startswith(f"{task.entry_point}("):
            # Not a call's failure: the program did not parse or load, or hit a limit (no check is in its text).
            return f"{status_only(verdict)}: {error_line(verdict.feedback)}"
        parts = self.split_checks(task)
        visible = task.checks if parts is None else parts[0]
        for args, want in zip(visible["calls"], visible["expected"]):
            call = _call_text(task, args)
            if between(verdict.feedback, f"{call} returned ", f", expected {_short(want)}") is not None:
                return verdict.feedback
            raised = between(verdict.feedback, f"{call} raised ", "")
            if raised is not None:
                return f"{call} raised {error_line(raised)}"
        return status_only(verdict)

    # -- verification ----------------------------------------------------------------------------

    def verify_batch(self, tasks: list[Task], completions: list[str], pool: SandboxPool) -> list[Verdict]:
        """One sandbox job per completion whose program could be read (a raw continuation's program is
        prompt + completion; extraction.extract_program reads a chat reply's); never raises on bad code."""
        self.check_batch(tasks, completions)
        read = [extract_program(c, t.prompt, t.entry_point) for t, c in zip(tasks, completions)]
        todo = [i for i, extraction in enumerate(read) if not extraction.failed]
        results = pool.run([_job(tasks[i], read[i].text) for i in todo]) if todo else []
        verdicts = [_not_extracted(task, extraction) for task, extraction in zip(tasks, read)]
        for i, result in zip(todo, results):
            verdicts[i] = _with_extraction(_judge(tasks[i], result, pool), read[i])
        return verdicts


def visible_calls(checks: dict[str, Any]) -> int:
    """How many leading calls an episode shows: ``checks.visible``, else half the calls (at least one)."""
    problems = visible_problems(checks)
    if problems:
        raise ValueError(f"code env: {problems[0]}")
    return checks.get("visible", max(1, len(checks["calls"]) // 2))


def visible_problems(checks: dict[str, Any]) -> list[str]:
    count, total = checks.get("visible", 1), len(checks["calls"])
    if type(count) is not int or not 0 < count <= total:
        return [f"checks.visible must be an integer from 1 to the number of calls ({total}), got {count!r:.40}"]
    return []


def _tests_total(task: Task) -> int | None:
    return len(task.checks["calls"]) if "calls" in task.checks else None  # a test program counts its own


def _not_extracted(task: Task, extraction: Extraction) -> Verdict:
    """The verdict of a reply no program could be read from: nothing ran."""
    return Verdict(
        components={"syntax": 0.0, "runs": 0.0, "tests_passed": 0.0},
        steps={**extraction.steps, "parses": False, "runs": False, "tests_passed": 0, "tests_total": _tests_total(task)},
        passed=False, feedback=extraction.feedback, status="format_error", failed_step="extract",
    )


def _with_extraction(verdict: Verdict, extraction: Extraction) -> Verdict:
    """``verdict`` with the extraction step first (nothing added for a raw continuation)."""
    return replace(verdict, steps={**extraction.steps, **verdict.steps}) if extraction.steps else verdict


def _job(task: Task, program: str) -> Job:
    if "test" in task.checks:  # a HumanEval-format task: its check(candidate) runs on the trusted side
        return program_job(task, program)
    return Job(program, task.entry_point, task.checks["calls"], expected=task.checks["expected"])


def _load_trusted(program: str) -> Any:
    # Only ever called on the generator's own references, never on model output.
    namespace: dict[str, Any] = {"__name__": "closedloop_reference"}
    exec(compile(program, "<reference>", "exec"), namespace)  # noqa: S102 - trusted generator output
    return namespace[ENTRY_POINT]


def _call_text(task: Task, args: list) -> str:
    return f"{task.entry_point}({', '.join(_short(a) for a in args)})"


def _judge(task: Task, result: ExecResult, pool: SandboxPool) -> Verdict:
    timing = {"wall_s": result.wall_s}
    total = _tests_total(task)
    if result.status == "infra_error":
        # Says nothing about the completion: no reward components, no step signals to learn from.
        verdict = not_judged(COMPONENTS, STEPS, result.error)
        return replace(verdict, steps={**verdict.steps, "tests_total": total}, timing=timing)
    if result.status not in ("passed", "failed"):
        parses = bool(result.steps.get("parses"))
        status, feedback = _failure(result, pool)
        return Verdict(
            # No test earned anything, so parsing earns nothing either (see tests_credit).
            components={"syntax": 0.0, "runs": 0.0, "tests_passed": 0.0},
            steps={"parses": parses, "runs": False, "tests_passed": 0, "tests_total": total},
            passed=False,
            feedback=feedback,
            status=status,
            timing=timing,
            failed_step="runs" if parses else "parses",
        )
    if "test" in task.checks:
        return _judge_test_program(result, timing)
    calls, expected = task.checks["calls"], task.checks["expected"]
    # The sandbox's trusted grader judged each call; the feedback names the first failing one.
    passed_count, raised, first_failure = 0, False, ""
    for args, want, outcome in zip(calls, expected, result.outputs):
        if outcome.passed:
            passed_count += 1
            continue
        raised = raised or not outcome.ok
        if not first_failure:
            if outcome.ok:
                first_failure = f"{_call_text(task, args)} returned {_short(outcome.value)}, expected {_short(want)}"
            else:
                first_failure = f"{_call_text(task, args)} raised {outcome.error}"
    passed = result.status == "passed"
    status = "passed" if passed else ("runtime_error" if raised else "failed")
    credit = 1.0 if passed else tests_credit(calls, expected, [outcome.passed for outcome in result.outputs])
    gate = 1.0 if credit > 0 else 0.0  # syntax and runs earn only beside some of what the task asked
    return Verdict(
        components={"syntax": gate, "runs": 0.0 if raised else gate, "tests_passed": credit},
        steps={"parses": True, "runs": not raised, "tests_passed": passed_count, "tests_total": total},
        passed=passed,
        feedback=f"passed all {total} tests" if passed else first_failure,
        status=status,
        timing=timing,
        failed_step=None if passed else ("runs" if raised else "tests_passed"),
    )


def tests_credit(calls: list[list], expected: list, passed: list[bool | None]) -> float:
    """Credit only for the calls the task asked something of.

    A call whose expected value is None or one of its own arguments is one that doing nothing
    (``pass``, ``return x``) answers right: passing it earns nothing, failing it costs. The credit is
    the asked calls passed over the asked calls plus the unasked ones failed. When no call asks
    anything beyond that (every answer is an argument, as in max(a, b)), the tests cannot tell
    doing nothing from doing the task, so only passing them all earns.
    """
    def plain(value: Any) -> str:
        return json.dumps(value, sort_keys=True)  # exact: True is not 1, 1.0 is not 1

    asked = [want is not None and all(plain(want) != plain(arg) for arg in args) for args, want in zip(calls, expected)]
    if not any(asked):
        return 1.0 if all(passed) else 0.0
    done = sum(bool(ok) for ok, ask in zip(passed, asked) if ask)
    broken = sum(not ok for ok, ask in zip(passed, asked) if not ask)
    return done / (sum(asked) + broken)


def _judge_test_program(result: ExecResult, timing: dict[str, float]) -> Verdict:
    steps = result.steps
    total = steps["tests_total"] or 0
    fraction = steps["tests_passed"] / total if total else 0.0
    passed = result.status == "passed"
    gate = 1.0 if fraction > 0 else 0.0  # syntax and runs earn only beside a passed test
    return Verdict(
        components={"syntax": gate, "runs": gate if steps["runs"] else 0.0, "tests_passed": fraction},
        steps={"parses": True, "runs": bool(steps["runs"]), "tests_passed": steps["tests_passed"], "tests_total": total},
        passed=passed,
        feedback=f"passed all {total} tests" if passed else result.error,
        status="passed" if passed else ("runtime_error" if not steps["runs"] else "failed"),
        timing=timing,
        failed_step=None if passed else ("runs" if not steps["runs"] else "tests_passed"),
    )


def _failure(result: ExecResult, pool: SandboxPool) -> tuple[str, str]:
    """(verdict status, feedback) for a job that did not run to completion."""
    if result.status == "error" and not result.steps.get("parses"):
        return "syntax_error", result.error
    if result.status == "timeout":
        return "timeout", f"timed out after {pool.limits.timeout_s}s"
    if result.status == "memory":
        return "memory", f"exceeded the memory limit ({pool.limits.memory_mb} MB)"
    if result.status == "output_limit":
        return "output_limit", f"printed or returned more than {pool.limits.max_output_bytes} bytes ({result.error})"
    if result.status == "process_limit":
        return "process_limit", result.error
    return "runtime_error", result.error  # error (an exception at load) or killed (exited early)
