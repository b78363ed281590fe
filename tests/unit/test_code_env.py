"""The code environment: seeded generation, disjoint splits, trusted references, verdicts."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from closedloop.config import CodeEnvParams, Params
from closedloop.envs import ENVIRONMENTS, get_env
from closedloop.envs.base import Task
from closedloop.envs.code import CodeEnv, _load_trusted, behaviour_hash, in_benchmark
from closedloop.rewards.combine import combine
from closedloop.rewards.shaping import progress
from closedloop.sandbox.grader import same_value
from closedloop.envs.code_tasks import FAMILIES
from closedloop.sandbox import Limits, SandboxPool, to_plain
from closedloop.sandbox.records import infra_error

KINDS = sorted(FAMILIES)


@pytest.fixture(scope="module")
def env() -> CodeEnv:
    return CodeEnv(CodeEnvParams())


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=Limits(timeout_s=1.0, memory_mb=256)) as shared:
        yield shared


@pytest.fixture(scope="module")
def tasks(env) -> list[Task]:
    """250 train + 100 benchmark tasks: every kind, both splits, every benchmark slice."""
    return (env.generate(250, seed=3, split="train") + env.generate(60, seed=3, split="benchmark")
            + env.generate(20, seed=3, split="benchmark", slice="edge")
            + env.generate(20, seed=3, split="benchmark", slice="failure_modes"))


def records(tasks: list[Task]) -> str:
    return json.dumps([t.to_record() for t in tasks], sort_keys=True)


class TestGenerate:
    def test_same_arguments_give_byte_identical_tasks(self, env):
        assert records(env.generate(60, 11, "train")) == records(CodeEnv(CodeEnvParams()).generate(60, 11, "train"))
        assert records(env.generate(60, 11, "train")) != records(env.generate(60, 12, "train"))

    def test_train_and_benchmark_are_disjoint_whatever_the_seeds(self, env):
        train = [t for seed in range(8) for t in env.generate(100, seed, "train")]
        benchmark = [t for seed in range(8) for t in env.generate(50, seed, "benchmark")]
        assert not {t.prompt for t in train} & {t.prompt for t in benchmark}
        # Disjoint in what the functions compute, not only in wording: the split is a property of
        # the behaviour, so a reworded benchmark task cannot reach train either.
        behaviours = {split: {_behaviour(t) for t in chosen} for split, chosen in (("train", train), ("benchmark", benchmark))}
        assert not behaviours["train"] & behaviours["benchmark"]
        assert all(in_benchmark(b) for b in behaviours["benchmark"])
        assert not any(in_benchmark(b) for b in behaviours["train"])

    def test_no_duplicates_and_kinds_in_round_robin(self, tasks):
        for split in ("train", "benchmark"):
            chosen = [t for t in tasks if t.split == split]
            assert len({t.task_id for t in chosen}) == len(chosen)
            assert len({t.prompt for t in chosen}) == len(chosen)
            per_kind = Counter(t.kind for t in chosen)
            if split == "train":
                assert set(per_kind.values()) == {len(chosen) // len(KINDS)}
            else:  # a kind whose benchmark space runs out in a slice passes its turn on
                assert set(per_kind) == set(KINDS) and min(per_kind.values()) >= len(chosen) // len(KINDS) // 2

    def test_slices(self, env, tasks):
        from closedloop.envs.code_tasks import is_failure_mode  # noqa: F401 - the rule the slices follow

        by_slice = Counter((t.split, t.slice) for t in tasks)
        assert by_slice[("benchmark", "core")] == 60 and by_slice[("benchmark", "edge")] == 20
        assert by_slice[("benchmark", "failure_modes")] == 20
        assert by_slice[("train", "core")] and by_slice[("train", "failure_modes")]  # train mixes both
        edge = [t for t in tasks if t.slice == "edge"]
        # Edge tasks test the empty list, the empty string, zero and large magnitudes first.
        firsts = {json.dumps(t.checks["calls"][0]) for t in edge}
        assert firsts <= {"[[]]", "[0, 0]", '[""]', "[0]"}

    def test_task_shape(self, env, tasks):
        for task in tasks:
            comment, signature, rest = task.prompt.split("\n")
            assert comment.startswith("# Return ") and comment.endswith(".") and signature.startswith("def f(")
            assert rest == "" and task.entry_point == "f" and task.env == "code"
            assert task.slice in ("core", "edge", "failure_modes")
            assert re.fullmatch(rf"code/{task.split}/(edge/)?[0-9a-f]{{10}}", task.task_id)
            assert task.reference.startswith("    return ") and task.reference.endswith("\n")
            assert 1 <= task.reference.count("\n") <= 3 and len(task.reference) < 80
            assert len(task.checks["calls"]) == len(task.checks["expected"]) == env.params.tests_per_task
            assert Task.from_record(json.loads(json.dumps(task.to_record()))) == task

    def test_tests_per_task_follows_params(self):
        small = CodeEnv(CodeEnvParams(tests_per_task=2)).generate(10, 0, "train")
        assert all(len(t.checks["calls"]) == 2 for t in small)

    def test_hidden_tests_catch_off_by_one_constants(self, tasks):
        # Mutation score: change each integer literal of a reference by ±1; the tests must notice.
        # A few mutants are equivalent (e.g. sum over x < 0 vs x < 1), so demand most, not all.
        killed = total = 0
        for task in tasks:
            for match in re.finditer(r"(?<![\w.])\d+", task.reference):
                for delta in (1, -1):
                    if int(match.group()) + delta < 0:
                        continue
                    mutant = task.reference[: match.start()] + str(int(match.group()) + delta) + task.reference[match.end():]
                    total += 1
                    killed += _fails_tests(task, mutant)
        assert total > 500 and killed / total >= 0.97, (killed, total)

    @pytest.mark.parametrize("split, n, message", [
        ("test", 5, "split must be one of"),
        ("train", -1, r"n \(-1\) must be >= 0"),
        ("benchmark", 2000, "nearly exhausted"),  # the benchmark share of arith formulas is ~80 tasks
    ])
    def test_bad_requests_say_why(self, env, split, n, message):
        with pytest.raises(ValueError, match=message):
            env.generate(n, 0, split)


def _behaviour(task: Task) -> str:
    params = task.prompt.splitlines()[1][len("def f(") : -len("):")]
    return behaviour_hash(params, _load_trusted(task.prompt + task.reference))


def _fails_tests(task: Task, body: str) -> bool:
    try:
        function = _load_trusted(task.prompt + body)
        return any(
            not same_value(want, to_plain(function(*args)))
            for args, want in zip(task.checks["calls"], task.checks["expected"])
        )
    except Exception:  # noqa: BLE001 - a mutant that raises is caught by the tests too
        return True


class TestVerify:
    def test_every_reference_passes_with_full_reward(self, env, pool, tasks):
        verdicts = env.verify_batch(tasks, [t.reference for t in tasks], pool)
        assert {v.status for v in verdicts} == {"passed"}
        assert all(v.components == {"syntax": 1.0, "runs": 1.0, "tests_passed": 1.0} for v in verdicts)
        assert all(v.failed_step is None and combine(v.components, CodeEnv.default_weights) == 1.0 for v in verdicts)
        assert all(v.steps["tests_passed"] == v.steps["tests_total"] == 6 for v in verdicts)
        assert {t.kind for t in tasks} == set(KINDS) and {t.split for t in tasks} == {"train", "benchmark"}

    def test_a_wrong_constant_loses_reward_and_feedback_names_the_call(self, env, pool, tasks):
        def bump(reference: str) -> str:  # the first integer literal, plus one
            return re.sub(r"(?<![\w.])(\d+)", lambda m: str(int(m.group()) + 1), reference, count=1)

        # One task per kind whose bumped constant changes the function (some bumps are equivalent).
        chosen = [next(t for t in tasks if t.kind == kind and _fails_tests(t, bump(t.reference))) for kind in KINDS]
        wrong = [bump(t.reference) for t in chosen]
        for task, verdict in zip(chosen, env.verify_batch(chosen, wrong, pool)):
            assert not verdict.passed and verdict.status == "failed", (task.reference, verdict)
            assert verdict.components["tests_passed"] < 1.0 and verdict.failed_step == "tests_passed"
            assert re.match(r"f\(.*\) returned .*, expected .*", verdict.feedback), verdict.feedback

    # (completion, verdict status, feedback pattern, parses); malformed output of a tiny model
    MALFORMED = [
        ("", "syntax_error", r"IndentationError: expected an indented block", False),
        ("hello world", "syntax_error", r"(Syntax|Indentation)Error", False),
        ("    return (", "syntax_error", r"SyntaxError: '\(' was never closed \(line 3\)", False),
        ("    import os; os._exit(0)", "runtime_error", r"exited with code 0", True),
        ("    import sys; sys.exit(0)", "runtime_error", r"raised SystemExit: 0", True),
        ("    return 1 / 0", "runtime_error", r"f\(.*\) raised ZeroDivisionError: division by zero", True),
        ("    return undefined_name", "runtime_error", r"NameError: name 'undefined_name' is not defined", True),
        ("    while True:\n        pass\n", "timeout", r"timed out after 1.0s", True),
        ("    return [0] * 10**10\n", "memory", r"exceeded the memory limit \(256 MB\)", True),
        ("    return None\n", "failed", r"returned None, expected", True),
        ("    return True\n", "failed", r"returned True, expected", True),  # bool never equals int
        ("    return 0\nprint('x' * 10**6)\n", "output_limit", r"printed or returned more than", True),
    ]

    @pytest.mark.parametrize("completion, status, feedback, parses", MALFORMED)
    def test_malformed_completions(self, env, pool, tasks, completion, status, feedback, parses):
        task = next(t for t in tasks if t.kind == "reduce" and t.checks["expected"][0] not in (0, 1))
        verdict = env.verify(task, completion, pool)
        assert verdict.status == status and not verdict.passed
        assert re.search(feedback, verdict.feedback), verdict.feedback
        # The steps say what held; no component earns without a test passed (do-nothing earns nothing).
        assert verdict.steps["parses"] is parses and verdict.components["syntax"] == 0.0
        assert verdict.components["tests_passed"] < 1.0
        assert verdict.failed_step == ("tests_passed" if status == "failed" else "runs" if parses else "parses")
        if not parses:  # not code at all: nothing earns reward
            assert combine(verdict.components, CodeEnv.default_weights) == 0.0
        assert set(verdict.components) == {"syntax", "runs", "tests_passed"} and "wall_s" in verdict.timing

    # A preamble that hits a sandbox limit and carries on, then the right answer: (preamble, status).
    LIMIT_HITS = [
        ("    import os, time\n    while True:\n        try:\n            pid = os.fork()\n        except OSError:\n"
         "            break\n        if pid == 0:\n            time.sleep(5)\n            os._exit(0)\n", "process_limit"),
        ("    import threading, time\n    try:\n        while True:\n"
         "            threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
         "    except RuntimeError:\n        pass\n", "process_limit"),
        ("    import signal\n    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n    try:\n"
         "        print('y' * 10**6, flush=True)\n    except OSError:\n        pass\n", "output_limit"),
    ]

    @pytest.mark.parametrize("preamble, status", LIMIT_HITS)
    def test_a_limit_hit_is_not_a_pass_whatever_it_returns(self, env, pool, tasks, preamble, status):
        task = next(t for t in tasks if t.kind == "reduce")
        verdict = env.verify(task, preamble + task.reference, pool)
        assert verdict.status == status and not verdict.passed, verdict
        assert combine(verdict.components, CodeEnv.default_weights) == 0.0
        limit = "process limit (16 processes" if status == "process_limit" else "more than 65536 bytes"
        assert limit in verdict.feedback, verdict.feedback

    def test_verdicts_repeat_exactly(self, env, pool, tasks):
        chosen = tasks[:20]
        completions = [t.reference if i % 3 else "    return 1 // 0\n" for i, t in enumerate(chosen)]

        def strip(verdicts):
            return [(v.components, v.steps, v.passed, v.feedback, v.status) for v in verdicts]

        assert strip(env.verify_batch(chosen, completions, pool)) == strip(env.verify_batch(chosen, completions, pool))

    def test_an_infra_error_is_neither_pass_nor_fail(self, env, tasks):
        class BrokenPool:
            limits = Limits()

            def run(self, jobs, progress=False):
                return [infra_error("worker died", "fork+rlimits") for _ in jobs]

        verdict = env.verify(tasks[0], tasks[0].reference, BrokenPool())
        assert verdict.status == "infra_error" and not verdict.passed
        assert set(verdict.components.values()) == {None}
        assert verdict.steps["parses"] is None and verdict.steps["tests_passed"] is None
        assert "not judged" in verdict.feedback and "worker died" in verdict.feedback

    def test_lengths_must_match(self, env, pool, tasks):
        with pytest.raises(ValueError, match="2 tasks but 1 completions"):
            env.verify_batch(tasks[:2], ["    return 0\n"], pool)

    def test_reference_is_the_tasks_reference(self, env, tasks):
        assert env.reference(tasks[0]) == tasks[0].reference


class TestSameValue:
    # (expected, got, equal?)
    CASES = [
        (1, 1, True),
        (1, True, False),  # bool is never an int
        (True, 1, False),
        (1, 1.0, False),  # an int expected wants an int
        (2.0, 2, True),  # a float expected accepts an int of the same value
        (0.3, 0.1 + 0.2, True),  # float tolerance 1e-9
        (0.3, 0.3001, False),
        ([1, [2, "a"]], [1, [2, "a"]], True),
        ([1, 2], [2, 1], False),
        ({"a": 1.0}, {"a": 1}, True),
        ({"a": 1}, {"b": 1}, False),
        (None, 0, False),
        ("1", 1, False),
    ]

    @pytest.mark.parametrize("expected, got, equal", CASES)
    def test_same_value(self, expected, got, equal):
        assert same_value(expected, got) is equal


class TestRegistry:
    def test_get_env_builds_from_params(self):
        params = Params.model_validate({"envs": {"code": {"tests_per_task": 3}}})
        env = get_env("code", params)
        assert isinstance(env, CodeEnv) and env.params.tests_per_task == 3
        assert set(ENVIRONMENTS) == {"code", "data", "script", "extract", "rules"}

    def test_unknown_env_is_named(self):
        with pytest.raises(ValueError, match="unknown environment 'chess'; known: \\['code', 'data'"):
            get_env("chess", Params())


def test_the_same_input_gets_the_same_verdict(env, pool, tasks):
    chosen = tasks[:40]
    completions = [t.reference if i % 3 else "    return None\n" for i, t in enumerate(chosen)]
    first, second = (env.verify_batch(chosen, completions, pool) for _ in range(2))
    strip = lambda v: (v.components, v.steps, v.passed, v.feedback, v.status, v.failed_step)  # noqa: E731
    assert [strip(v) for v in first] == [strip(v) for v in second]


def _signature(task: Task) -> str:
    return task.prompt.splitlines()[-1]  # "def f(xs):"


class TestChatReplies:
    """An instruct model's reply: the program is read out of it (envs/extraction.py) before it runs."""

    REPLIES = [  # (how the reference is wrapped, how extraction reads it)
        (lambda t: f"Here is the function:\n```python\n{_signature(t)}\n{t.reference}```\nIt works because...", "fenced"),
        (lambda t: f"```python\n{t.reference}```", "fenced"),  # only the body, fenced
        (lambda t: f"{_signature(t)}\n{t.reference}\nThis returns the value asked for.", "signature"),  # unfenced
    ]

    @pytest.mark.parametrize("wrap, how", REPLIES)
    def test_a_wrapped_reference_passes_like_the_raw_one(self, env, pool, tasks, wrap, how):
        chosen = [next(t for t in tasks if t.kind == kind) for kind in KINDS]
        raw = env.verify_batch(chosen, [t.reference for t in chosen], pool)
        for task, plain, verdict in zip(chosen, raw, env.verify_batch(chosen, [wrap(t) for t in chosen], pool)):
            assert verdict.passed and verdict.components == plain.components, (task.reference, verdict)
            assert list(verdict.steps) == ["extract", *plain.steps] and verdict.steps["extract"] == how
            assert progress(verdict.steps) == progress(plain.steps) == 1.0  # reading a reply earns nothing by itself

    def test_raw_continuations_get_no_extract_step(self, env, pool, tasks):
        for verdict in env.verify_batch(tasks[:5], [t.reference for t in tasks[:5]], pool):
            assert list(verdict.steps) == ["parses", "runs", "tests_passed", "tests_total"]

    def test_a_broken_fence_fails_at_the_extract_step_and_runs_nothing(self, env, pool, tasks):
        task = tasks[0]
        verdict = env.verify(task, f"```python\n{_signature(task)}\n{task.reference}", pool)
        assert verdict.failed_step == "extract" and verdict.status == "format_error" and not verdict.passed
        assert verdict.feedback.startswith("extract: the ``` fence opened on line 1 is never closed")
        assert verdict.components == {"syntax": 0.0, "runs": 0.0, "tests_passed": 0.0} and verdict.timing == {}
        assert verdict.steps == {"extract": False, "parses": False, "runs": False, "tests_passed": 0, "tests_total": 6}
        assert progress(verdict.steps) == 0.0

    def test_a_fenced_wrong_answer_fails_where_the_raw_one_does(self, env, pool, tasks):
        task = next(t for t in tasks if t.kind == "reduce")
        for body in ("    return (\n", "    return 1 / 0\n", "    return None\n"):
            raw, fenced = env.verify_batch([task, task], [body, f"```python\n{_signature(task)}\n{body}```"], pool)
            assert (fenced.failed_step, fenced.status, fenced.components) == (raw.failed_step, raw.status, raw.components)

    def test_a_humaneval_reply_that_restates_the_def_keeps_the_prompts_imports(self, env, pool):
        prompt = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """The sum of xs."""\n'
        task = Task(task_id="HumanEval/x", env="code", split="benchmark", slice="core", kind="humaneval", prompt=prompt,
                    entry_point="total", checks={"test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n"},
                    reference="    return sum(xs)\n")
        reply = "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```"
        raw, chat = env.verify_batch([task, task], [task.reference, reply], pool)
        assert raw.passed and chat.passed and chat.steps["extract"] == "fenced"
