"""The code environment: write a short Python function from a one-line spec; hidden tests judge it.

Generation is trusted: expected outputs come from executing the generator's own reference in this
process. Model completions only ever run in the sandbox, and their outputs are compared here.

Splits are disjoint by construction: a task belongs to the benchmark iff the hash of its *behaviour*
(the reference's outputs on a fixed probe set) falls in a fixed bucket, so train can never emit a
benchmark task, nor a differently worded task that computes the same function.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from closedloop.envs.base import Task, Verdict
from closedloop.envs.code_tasks import FAMILIES, probe_inputs
from closedloop.sandbox.child import to_plain
from closedloop.sandbox.grader import same_value
from closedloop.sandbox.records import ExecResult, Job

if TYPE_CHECKING:
    from closedloop.config import CodeEnvParams
    from closedloop.sandbox.pool import SandboxPool

SPLITS = ("train", "benchmark")
BENCHMARK_PER_MILLE = 150  # share of all task behaviours reserved for the benchmark
ENTRY_POINT = "f"
_MAX_DRAWS_PER_TASK = 400  # rejection sampling budget before we say the space is exhausted
_REPR_CHARS = 120


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


class CodeEnv:
    name = "code"

    def __init__(self, params: CodeEnvParams) -> None:
        self.params = params

    # -- generation ------------------------------------------------------------------------------

    def generate(self, n: int, seed: int, split: str) -> list[Task]:
        """``n`` distinct tasks of ``split``, the same for the same arguments; kinds in round robin."""
        if split not in SPLITS:
            raise ValueError(f"code env: split must be one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ValueError(f"code env: n ({n}) must be >= 0")
        task_file = self.params.benchmark_file if split == "benchmark" else self.params.train_file
        if task_file:
            return self._from_file(Path(task_file), n, seed, split)
        rng = random.Random(f"code/{split}/{seed}")
        kinds = list(FAMILIES)
        seen: set[str] = set()  # behaviour hashes: two tasks computing the same function are duplicates
        tasks = []
        for index in range(n):
            kind = kinds[index % len(kinds)]
            for _ in range(_MAX_DRAWS_PER_TASK):
                spec = FAMILIES[kind].sample(rng)
                behaviour, task = self._build(spec, split)
                if task is not None and behaviour not in seen:
                    seen.add(behaviour)
                    tasks.append(task)
                    break
            else:
                raise ValueError(
                    f"code env: drew {_MAX_DRAWS_PER_TASK} {kind!r} specs without a new {split} task "
                    f"after {index} tasks; the space is nearly exhausted, ask for fewer than {n}"
                )
        return tasks

    @staticmethod
    def _from_file(path: Path, n: int, seed: int, split: str) -> list[Task]:
        """A HumanEval-format set: the benchmark takes it whole; training draws ``n`` (cycling) in a seeded order."""
        from closedloop.envs.humaneval import load_humaneval

        tasks = load_humaneval(path, split)
        if split == "benchmark":
            return tasks
        random.Random(f"code/{split}/{seed}").shuffle(tasks)
        return [tasks[i % len(tasks)] for i in range(n)]

    def _build(self, spec: tuple, split: str) -> tuple[str, Task | None]:
        """(behaviour hash, the task) for ``spec``; the task is None when it belongs to the other split."""
        family = FAMILIES[spec[0]]
        comment, expression = family.render(spec)
        prompt = f"# {comment}\ndef {ENTRY_POINT}({family.params}):\n"
        reference = f"    return {expression}\n"
        function = _load_trusted(prompt + reference)
        behaviour = behaviour_hash(family.params, function)
        if in_benchmark(behaviour) != (split == "benchmark"):
            return behaviour, None
        spec_hash = _hash(list(spec))
        calls = family.inputs(spec, random.Random(spec_hash), self.params.tests_per_task)
        expected = [to_plain(function(*json.loads(json.dumps(args)))) for args in calls]
        task = Task(
            task_id=f"code/{split}/{spec_hash[:10]}",
            env=self.name,
            split=split,
            slice="core",
            kind=family.kind,
            prompt=prompt,
            entry_point=ENTRY_POINT,
            checks={"calls": calls, "expected": expected},
            reference=reference,
        )
        return behaviour, task

    @staticmethod
    def reference(task: Task) -> str:
        return task.reference

    # -- verification ----------------------------------------------------------------------------

    def verify(self, task: Task, completion: str, pool: SandboxPool) -> Verdict:
        return self.verify_batch([task], [completion], pool)[0]

    def verify_batch(self, tasks: list[Task], completions: list[str], pool: SandboxPool) -> list[Verdict]:
        """One sandbox job per completion (program = prompt + completion); never raises on bad code."""
        if len(tasks) != len(completions):
            raise ValueError(f"code env: {len(tasks)} tasks but {len(completions)} completions")
        jobs = [_job(t, c) for t, c in zip(tasks, completions)]
        results = pool.run(jobs)
        return [_judge(task, result, pool) for task, result in zip(tasks, results)]


def _job(task: Task, completion: str) -> Job:
    if "test" in task.checks:  # a HumanEval-format task: its check(candidate) runs on the trusted side
        from closedloop.envs.humaneval import job_for

        return job_for(task, completion)
    return Job(task.prompt + completion, task.entry_point, task.checks["calls"], expected=task.checks["expected"])


def _load_trusted(program: str) -> Any:
    # Only ever called on the generator's own references, never on model output.
    namespace: dict[str, Any] = {"__name__": "closedloop_reference"}
    exec(compile(program, "<reference>", "exec"), namespace)  # noqa: S102 - trusted generator output
    return namespace[ENTRY_POINT]


def _call_text(task: Task, args: list) -> str:
    return f"{task.entry_point}({', '.join(_short(a) for a in args)})"


def _judge(task: Task, result: ExecResult, pool: SandboxPool) -> Verdict:
    timing = {"wall_s": result.wall_s}
    total = len(task.checks["calls"]) if "calls" in task.checks else None  # a test program counts its own
    if result.status == "infra_error":
        # Says nothing about the completion: no reward components, no step signals to learn from.
        return Verdict(
            components={"syntax": None, "runs": None, "tests_passed": None},
            steps={"parses": None, "runs": None, "tests_passed": None, "tests_total": total},
            passed=False,
            feedback=f"not judged (sandbox infrastructure error, not the completion's fault): {result.error}",
            status="infra_error",
            timing=timing,
        )
    if result.status not in ("passed", "failed"):
        parses = bool(result.steps.get("parses"))
        status, feedback = _failure(result, pool)
        return Verdict(
            components={"syntax": float(parses), "runs": 0.0, "tests_passed": 0.0},
            steps={"parses": parses, "runs": False, "tests_passed": 0, "tests_total": total},
            passed=False,
            feedback=feedback,
            status=status,
            timing=timing,
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
    return Verdict(
        components={"syntax": 1.0, "runs": 0.0 if raised else 1.0, "tests_passed": passed_count / total if total else 0.0},
        steps={"parses": True, "runs": not raised, "tests_passed": passed_count, "tests_total": total},
        passed=passed,
        feedback=f"passed all {total} tests" if passed else first_failure,
        status=status,
        timing=timing,
    )


def _judge_test_program(result: ExecResult, timing: dict[str, float]) -> Verdict:
    steps = result.steps
    total = steps["tests_total"] or 0
    fraction = steps["tests_passed"] / total if total else 0.0
    passed = result.status == "passed"
    return Verdict(
        components={"syntax": 1.0, "runs": 1.0 if steps["runs"] else 0.0, "tests_passed": fraction},
        steps={"parses": True, "runs": bool(steps["runs"]), "tests_passed": steps["tests_passed"], "tests_total": total},
        passed=passed,
        feedback=f"passed all {total} tests" if passed else result.error,
        status="passed" if passed else ("runtime_error" if not steps["runs"] else "failed"),
        timing=timing,
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
        return "runtime_error", f"printed or returned more than {pool.limits.max_output_bytes} bytes"
    return "runtime_error", result.error  # error (an exception at load) or killed (exited early)
