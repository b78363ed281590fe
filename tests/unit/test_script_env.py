"""The script environment and the sandbox's script jobs: generation, trees, verdicts, failure modes.

Every completion runs in a real sandbox pool built as the loop builds it (exec allowed); nothing is
mocked. One module-scoped pool of two workers keeps the file to a few seconds of jobs.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from closedloop.config import Params, ScriptEnvParams
from closedloop.envs import get_env
from closedloop.envs.base import HELDOUT, SLICES, Environment, Task, in_benchmark
from closedloop.envs.script import COMPONENTS, MAX_FILES, MAX_PROMPT_CHARS, MAX_REFERENCE_CHARS, ScriptEnv, compare_trees, task_key
from closedloop.envs.script_tasks import FAMILIES, expected_tree
from closedloop.sandbox import ExecResult, Job, Limits, SandboxPool
from closedloop.sandbox.child import SPECIAL_MARKER
from closedloop.sandbox.pool import DEFAULT_PRELOAD
from closedloop.sandbox.records import infra_error

STOP_STRINGS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")
PARAMS = ScriptEnvParams()


@pytest.fixture(scope="module")
def env() -> ScriptEnv:
    return ScriptEnv(PARAMS)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=Limits.of(PARAMS.sandbox), isolation="auto",
                     preload=DEFAULT_PRELOAD + ScriptEnv.sandbox_preload) as shared:
        yield shared


@pytest.fixture(scope="module")
def tasks(env) -> list[Task]:
    """150 train tasks and 40 of each benchmark slice: every family, both splits."""
    return env.generate(150, seed=5, split="train") + [
        t for slice in SLICES for t in env.generate(40, seed=5, split="benchmark", slice=slice)]


@pytest.fixture(scope="module")
def reference_verdicts(env, tasks, pool):
    return env.verify_batch(tasks, [t.reference for t in tasks], pool)


def records(tasks: list[Task]) -> str:
    return json.dumps([t.to_record() for t in tasks], sort_keys=True)


def key(task: Task) -> str:
    return task_key({name: task.checks[name] for name in ("op", "args", "start")})


def plain(verdict) -> dict:
    """A verdict without its wall-clock figures, which are the only thing allowed to differ."""
    return {**verdict.__dict__, "timing": {}}


class TestGenerate:
    def test_same_arguments_give_byte_identical_tasks(self, env):
        assert records(env.generate(60, 11, "train")) == records(ScriptEnv(PARAMS).generate(60, 11, "train"))
        assert records(env.generate(60, 11, "train")) != records(env.generate(60, 12, "train"))
        edge = env.generate(20, 11, "benchmark", "edge")
        assert records(edge) == records(env.generate(20, 11, "benchmark", "edge"))

    def test_train_and_benchmark_are_disjoint_whatever_the_seeds(self, env):
        train = [t for seed in range(4) for t in env.generate(120, seed, "train")]
        benchmark = [t for seed in range(4) for slice in SLICES for t in env.generate(30, seed, "benchmark", slice)]
        assert not {key(t) for t in train} & {key(t) for t in benchmark}
        assert not any(in_benchmark(key(t)) for t in train)
        # a held-out family's operation is one no train family asks: its whole space is the benchmark's
        assert all(in_benchmark(key(t)) for t in benchmark if t.slice != HELDOUT)
        assert not {t.prompt for t in train} & {t.prompt for t in benchmark}

    def test_tasks_are_distinct_and_ids_unique(self, tasks):
        assert len({t.task_id for t in tasks}) == len(tasks)
        for split in ("train", "benchmark"):
            keys = [key(t) for t in tasks if t.split == split]
            assert len(set(keys)) == len(keys)
            prompts = [t.prompt for t in tasks if t.split == split]
            assert len(set(prompts)) == len(prompts)  # the key is what the prompt says, nothing hidden

    def test_train_mixes_every_family_and_slices_draw_only_their_own(self, tasks):
        train = [t for t in tasks if t.split == "train"]
        assert {t.kind for t in train} == {f.name for f in FAMILIES if f.slice != HELDOUT}
        slice_of = {f.name: f.slice for f in FAMILIES}
        assert all(t.slice == slice_of[t.kind] for t in tasks)
        for slice in SLICES:
            chosen = [t for t in tasks if t.split == "benchmark" and t.slice == slice]
            assert len(chosen) == 40 and {t.kind for t in chosen} == {f.name for f in FAMILIES if f.slice == slice}
            assert all(t.task_id.startswith(f"script/benchmark/{slice}/") for t in chosen)

    def test_prompts_and_references_fit_the_tiny_policy(self, tasks):
        for t in tasks:
            assert len(t.prompt) <= MAX_PROMPT_CHARS and len(t.reference) <= MAX_REFERENCE_CHARS, t.task_id
            assert t.prompt.endswith("\nimport os\n") and t.reference.endswith("\n")
            assert not any(stop in t.prompt + t.reference for stop in STOP_STRINGS), t.task_id
            assert not any(line.startswith(("def ", "class ", "print(")) for line in t.reference.splitlines())
            assert t.entry_point == "" and (t.env, t.kind) == ("script", t.kind)
            assert all(f"#   {path}\n" in t.prompt for path in t.checks["start"])
            assert 1 <= len(t.checks["start"]) <= MAX_FILES

    def test_checks_are_plain_json_and_the_expected_tree_follows_from_the_spec(self, tasks):
        for t in tasks:
            assert json.loads(json.dumps(t.checks)) == t.checks
            assert expected_tree({name: t.checks[name] for name in ("op", "args", "start")}) == t.checks["expected"]

    def test_bad_arguments_fail_clearly(self, env):
        with pytest.raises(ValueError, match="split must be one of"):
            env.generate(3, 0, "test")
        with pytest.raises(ValueError, match="slice must be one of"):
            env.generate(3, 0, "benchmark", "hard")
        with pytest.raises(ValueError, match=r"n \(-1\) must be >= 0"):
            env.generate(-1, 0, "train")
        assert env.generate(0, 0, "train") == []

    def test_it_is_a_registered_environment(self):
        built = get_env("script", Params())
        assert isinstance(built, ScriptEnv) and isinstance(built, Environment)
        assert built.params.sandbox.allow_exec is True
        assert set(built.component_sources()) == set(COMPONENTS) == set(built.default_weights)


class TestReferences:
    def test_every_reference_passes_in_the_sandbox(self, tasks, reference_verdicts):
        assert len(tasks) >= 200
        failures = [(t.task_id, v.feedback) for t, v in zip(tasks, reference_verdicts) if not v.passed]
        assert not failures
        for t, v in zip(tasks, reference_verdicts):
            assert v.components == {"syntax": 1.0, "runs": 1.0, "files": 1.0}
            assert (v.status, v.failed_step) == ("passed", None)
            paths = sorted(set(t.checks["expected"]))
            assert list(v.steps) == ["parses", "exits_cleanly", "files_match"] + [f"file:{p}" for p in paths]
            assert v.steps["files_match"] == 1.0 and v.feedback == f"all {len(paths)} files match"

    def test_references_pass_without_bubblewrap_too(self, env, tasks):
        # isolation fork: the job's uid cannot traverse the pool's 0700 scratch directory, so the tree
        # must be read through the job directory itself ("unexpected file ." before).
        with SandboxPool(workers=1, limits=Limits.of(PARAMS.sandbox), isolation="fork",
                         preload=DEFAULT_PRELOAD + ScriptEnv.sandbox_preload) as forked:
            verdicts = env.verify_batch(tasks[:6], [t.reference for t in tasks[:6]], forked)
        assert [(v.passed, v.feedback) for v in verdicts] == [(True, v.feedback) for v in verdicts]

    def test_the_same_completion_gets_the_same_verdict(self, env, tasks, pool, reference_verdicts):
        again = env.verify_batch(tasks[:40], [t.reference for t in tasks[:40]], pool)
        assert [plain(v) for v in again] == [plain(v) for v in reference_verdicts[:40]]
        broken = [t.reference + "open('zz.txt', 'w').write('x')\n" for t in tasks[:10]]
        assert [plain(v) for v in env.verify_batch(tasks[:10], broken, pool)] == \
               [plain(v) for v in env.verify_batch(tasks[:10], broken, pool)]


def of_kind(tasks: list[Task], kind: str) -> list[Task]:
    chosen = [t for t in tasks if t.kind == kind]
    assert chosen, kind
    return chosen


class TestPerturbations:
    # (kind, how the reference is broken, the mistake it stands for): each must fail every task of its kind
    TARGETED = [
        ("concat_numeric", lambda r: "\n".join(l for l in r.split("\n") if not l.startswith("names.sort")), "name order, number asked"),
        ("count_exact_case", lambda r: r.replace("in l for", "in l.upper() for"), "case-insensitive count"),
        ("filter_last_line", lambda r: r.replace(".read().splitlines()", "").replace("line + '\\n'", "line"), "last newline dropped"),
        ("append_line", lambda r: r.replace("'a')", "'w')"), "overwrote instead of appending"),
        ("copy_backup", lambda r: r.replace("shutil.copy", "shutil.move"), "moved instead of copying"),
        ("move_with_decoys", lambda r: r.replace("n.endswith(", "(lambda e: e in n)("), "substring, not suffix"),
        ("move_into_folder", lambda r: r.replace("os.rename(", "__import__('shutil').copy("), "originals left behind"),
        ("rename_ext", lambda r: r.replace("os.rename(", "__import__('shutil').copy("), "copied, old one kept"),
        ("count_errors", lambda r: r.replace("f'{n}\\n'", "f'{n + 1}\\n'"), "wrong constant"),
        ("count_per_file", lambda r: r.replace("sorted(", "list(reversed(sorted(").replace(")):", ")))):"), "wrong order"),
        ("filter_lines", lambda r: r.replace("line + '\\n'", "line"), "trailing newlines missing"),
        ("delete_nested", lambda r: r.replace("os.walk('.')", "[('.', [], os.listdir('.'))]"), "subfolders skipped"),
    ]

    @pytest.mark.parametrize("kind, perturb, mistake", TARGETED, ids=[row[0] for row in TARGETED])
    def test_each_failure_mode_is_caught(self, env, tasks, pool, kind, perturb, mistake):
        chosen = of_kind(tasks, kind)
        broken = [perturb(t.reference) for t in chosen]
        assert all(b != t.reference for b, t in zip(broken, chosen)), f"perturbation for {mistake} did not apply"
        for t, v in zip(chosen, env.verify_batch(chosen, broken, pool)):
            assert not v.passed and v.status == "failed", (mistake, t.task_id, v.feedback)
            assert v.failed_step == "files_match" and v.components["files"] < 1.0
            # Parsing and running earn only beside some of the asked change (none of it: nothing earns).
            earned = float(v.components["files"] > 0)
            assert (v.components["syntax"], v.components["runs"]) == (earned, earned)
            assert v.steps["parses"] and v.steps["exits_cleanly"]
            assert v.steps["files_match"] == v.components["files"]
            wrong = [step for step, ok in v.steps.items() if step.startswith("file:") and not ok]
            assert wrong and wrong[0][len("file:"):] in v.feedback

    def test_generic_breakages(self, env, tasks, pool):
        sample = [t for t in tasks[::9] if t.checks["expected"]]
        first = {t.task_id: sorted(t.checks["expected"])[0] for t in sample}
        # (perturbation, expected status, failed step, feedback that must appear)
        cases = [
            (lambda t: t.reference + "open('extra file.txt', 'w').write('x')\n", "failed", "files_match", "unexpected file extra file.txt"),
            (lambda t: t.reference + f"os.remove({first[t.task_id]!r})\n", "failed", "files_match", "missing "),
            (lambda t: t.reference + f"open({first[t.task_id]!r}, 'a').write('!')\n", "failed", "files_match", ": content "),
            (lambda t: t.reference + "raise SystemExit(3)\n", "runtime_error", "exits_cleanly", "SystemExit: 3"),
            (lambda t: t.reference + "open('nope/x.txt')\n", "runtime_error", "exits_cleanly", "FileNotFoundError"),
            (lambda t: "while True:\n    pass\n", "timeout", "exits_cleanly", "timed out"),  # 2 tasks: 5 s each
        ]
        for perturb, status, step, text in cases:
            chosen = sample[:2] if status == "timeout" else sample
            for t, v in zip(chosen, env.verify_batch(chosen, [perturb(t) for t in chosen], pool)):
                assert (v.status, v.failed_step, v.passed) == (status, step, False), (t.task_id, v)
                assert text in v.feedback, (t.task_id, v.feedback)
                assert v.components["files"] < 1.0 and v.components["syntax"] == float(v.components["files"] > 0)
                if status != "failed":  # it parsed, but did not finish: nothing of the task earned
                    assert v.components == {"syntax": 0.0, "runs": 0.0, "files": 0.0}
                    assert v.steps["parses"] is True and v.steps["exits_cleanly"] is False

    def test_a_clean_sys_exit_and_other_ways_to_the_same_tree_pass(self, env, tasks, pool):
        rename = of_kind(tasks, "rename_ext")[0]
        old, new = rename.checks["args"]["old"], rename.checks["args"]["new"]
        shell = (f"import subprocess\nsubprocess.run(['sh', '-c', 'for f in *{old}; do [ -e \"$f\" ] && "
                 f"mv \"$f\" \"${{f%{old}}}{new}\"; done; true'], check=True)\n")
        completions = [rename.reference + "import sys\nsys.exit(0)\n", shell,
                       "from pathlib import Path\n" + f"for p in Path('.').glob('*{old}'):\n    p.rename(p.with_suffix({new!r}))\n"]
        for v in env.verify_batch([rename] * 3, completions, pool):
            assert v.passed, v.feedback

    def test_partial_credit_counts_wrong_missing_and_unexpected_paths(self, env, pool):
        task = next(t for t in env.generate(40, 0, "train") if t.kind == "move_into_folder")
        copies = task.reference.replace("os.rename(", "__import__('shutil').copy(")
        verdict = env.verify(task, copies, pool)
        moved = [p for p in task.checks["start"] if p not in task.checks["expected"]]
        # Credit counts only the paths the task changes: each moved file's new path (right) and its
        # original (left behind: wrong); the files the task leaves alone earn nothing for staying.
        assert moved and verdict.components["files"] == pytest.approx(len(moved) / (2 * len(moved)))
        assert verdict.steps[f"file:{moved[0]}"] is False and verdict.feedback.startswith("unexpected file ")


class TestMalformed:
    @pytest.mark.parametrize("completion, status", [
        ("", "format_error"),  # nothing written
        ("  \n\t\n", "format_error"),  # blank
        ("Sure! Here is the script you asked for:\n", "syntax_error"),  # prose
        ("lorem ipsum (( ]] %%%\n", "syntax_error"),  # garbage
        ("for n in os.listdir('.'):\n    if n.endswith('.tx", "syntax_error"),  # truncated in a string
        ("with open('out.txt', 'w') as f:\n", "syntax_error"),  # truncated before a block's body
        ("x = 1\x00\n", "syntax_error"),  # a null byte
    ])
    def test_malformed_output_gets_zero_and_never_raises(self, env, tasks, pool, completion, status):
        for t, v in zip(tasks[:3], env.verify_batch(tasks[:3], [completion] * 3, pool)):
            assert v.components == {"syntax": 0.0, "runs": 0.0, "files": 0.0}
            assert (v.status, v.failed_step, v.passed) == (status, "parses", False)
            assert v.steps["parses"] is False and v.steps["files_match"] == 0.0
            assert all(v.steps[f"file:{p}"] is False for p in t.checks["expected"])
            assert v.feedback

    def test_an_infra_error_is_not_judged(self, tasks):
        from closedloop.envs.script import _judge

        verdict = _judge(tasks[0], infra_error("worker died", "fork"))
        assert verdict.status == "infra_error" and set(verdict.components.values()) == {None}
        assert "not judged" in verdict.feedback

    def test_a_completed_job_without_a_tree_is_a_runtime_error(self, tasks):
        from closedloop.envs.script import _judge

        result = ExecResult("completed", [], "", "", "", 0, 0.01, 0.01, 0, "fork", {"parses": True}, None)
        verdict = _judge(tasks[0], result)
        assert (verdict.status, verdict.failed_step, verdict.components["files"]) == ("runtime_error", "exits_cleanly", 0.0)

    def test_mismatched_lengths_are_a_caller_error(self, env, tasks, pool):
        with pytest.raises(ValueError, match="2 tasks but 1 completions"):
            env.verify_batch(tasks[:2], ["x"], pool)


class TestCompareTrees:
    # (expected, got, states, feedback); each row is one kind of difference
    CASES = [
        ({"a": "1\n"}, {"a": "1\n"}, {"a": True}, ""),  # identical
        ({"r.txt": "4\n"}, {"r.txt": "3\n"}, {"r.txt": False}, "r.txt: content '3\\n' expected '4\\n'"),  # wrong content
        ({"archive/a.log": "x"}, {}, {"archive/a.log": False}, "missing archive/a.log"),  # missing
        ({"b": ""}, {"a.log": "x", "b": ""}, {"a.log": False, "b": True}, "unexpected file a.log"),  # left behind
        ({"a": "no newline"}, {"a": "no newline\n"}, {"a": False}, "a: content 'no newline\\n' expected 'no newline'"),
        ({}, {}, {}, ""),  # an empty tree matches an empty tree
        ({"z": "1", "a": "1"}, {"z": "2", "a": "2"}, {"a": False, "z": False}, "a: content"),  # the first in path order
    ]

    @pytest.mark.parametrize("expected, got, states, feedback", CASES)
    def test_compare(self, expected, got, states, feedback):
        found, message = compare_trees(expected, got)
        assert found == states and list(found) == sorted(found)
        assert message.startswith(feedback) if feedback else message == ""

    def test_long_content_is_shortened_in_feedback(self):
        _, message = compare_trees({"a": "x" * 500}, {"a": "y" * 500})
        assert len(message) < 160


class TestScriptJobs:
    """The sandbox side: script jobs (entry point "") and the collected file tree."""

    def run(self, pool, program: str, files: dict[str, str] | None = None) -> ExecResult:
        return pool.run([Job(program, "", files=files or {}, collect_files=True)])[0]

    @pytest.mark.parametrize("program, status, error", [
        ("x = 1\n", "completed", ""),  # ran to its end
        ("import sys\nsys.exit(0)\nopen('never', 'w')\n", "completed", ""),  # a clean exit stops the script
        ("import sys\nsys.exit()\n", "completed", ""),
        ("import sys\nsys.exit(1)\n", "error", "SystemExit: 1"),  # a nonzero exit is an error
        ("import sys\nsys.exit('bad input')\n", "error", "SystemExit: bad input"),
        ("raise KeyError('k')\n", "error", "KeyError: 'k'"),
        ("x = (\n", "error", "SyntaxError"),
    ])
    def test_script_statuses(self, pool, program, status, error):
        result = self.run(pool, program)
        assert (result.status, result.outputs) == (status, []) and error in result.error
        assert (result.files is not None) == (status == "completed")
        assert result.steps["runs"] == (status == "completed")
        assert result.steps["parses"] == ("SyntaxError" not in error)

    def test_the_script_runs_as_main_in_its_job_directory(self, pool):
        result = self.run(pool, "import os\nprint(__name__)\nos.chdir('d')\nopen('made', 'w').write('m')\n", {"d/x": "1"})
        assert result.stdout == "__main__\n" and result.files == {"d/made": "m", "d/x": "1"}

    def test_the_tree_reports_files_only_and_never_follows_links(self, pool):
        program = ("import os\nos.makedirs('empty/dir')\nos.symlink('/etc/passwd', 'link')\nos.mkfifo('pipe')\n"
                   "open('bin', 'wb').write(b'ok\\xff\\xfe')\nopen('ünï côde.txt', 'w').write('é 日本\\n')\n")
        result = self.run(pool, program, {"start.txt": "s\n"})
        assert result.status == "completed", result.error
        assert result.files == {"bin": "ok\\xff\\xfe", "link": "<symlink to /etc/passwd>", "pipe": SPECIAL_MARKER,
                                "start.txt": "s\n", "ünï côde.txt": "é 日本\n"}
        assert list(result.files) == sorted(result.files)

    def test_a_tree_over_the_output_cap_is_an_output_limit(self, pool):
        cap = PARAMS.sandbox.max_output_bytes
        result = self.run(pool, f"for i in range(4):\n    open(f'f{{i}}', 'w').write('x' * {cap // 3})\n")
        assert result.status == "output_limit" and result.files is None

    def test_without_collect_files_no_tree_comes_back(self, pool):
        result = pool.run([Job("open('a', 'w').write('1')\n", "")])[0]
        assert (result.status, result.files) == ("completed", None)

    def test_a_function_job_can_collect_its_files_after_the_calls(self, pool):
        program = "def f(x):\n    open(f'out{x}', 'w').write(str(x))\n    return x\n"
        result = pool.run([Job(program, "f", [[1], [2]], expected=[1, 2], collect_files=True)])[0]
        assert (result.status, result.files) == ("passed", {"out1": "1", "out2": "2"})

    def test_a_script_job_takes_no_calls_and_a_test_job_no_tree(self):
        with pytest.raises(ValueError, match="script job"):
            Job("x = 1\n", "", [[1]])
        with pytest.raises(ValueError, match="collect_files"):
            Job("def f(x): return x\n", "f", test="def check(c): pass\n", collect_files=True)

    def test_exec_is_allowed_and_files_outside_the_job_directory_are_untouched(self, pool, tmp_path):
        if "bwrap" not in pool.isolation and "uid" not in pool.isolation:
            pytest.skip(f"isolation {pool.isolation}: jobs share this process's view and uid")
        outside = tmp_path / "keep.txt"
        outside.write_text("original\n")
        program = ("import os, subprocess\n"
                   "listing = subprocess.run(['ls'], capture_output=True, text=True, check=True).stdout\n"
                   "open('listing.txt', 'w').write(listing)\n"
                   "subprocess.run(['sh', '-c', 'echo hi > from_sh.txt; mkdir -p sub && mv a.txt sub/'], check=True)\n"
                   f"for attempt in (['sh', '-c', 'echo pwned > {outside}'], ['rm', '-f', '{outside}']):\n"
                   "    subprocess.run(attempt, capture_output=True)\n"
                   "try:\n"
                   f"    open({str(outside)!r}, 'w').write('pwned')\n"
                   "except OSError:\n"
                   "    pass\n")
        result = self.run(pool, program, {"a.txt": "a\n"})
        assert result.status == "completed", (result.error, result.stderr)
        assert result.files == {"from_sh.txt": "hi\n", "listing.txt": "a.txt\n", "sub/a.txt": "a\n"}
        assert outside.read_text() == "original\n"
        assert os.listdir(tmp_path) == ["keep.txt"]


def test_no_two_tasks_of_a_family_ask_for_the_same_tree():
    """Distinct specs give distinct expected trees too: the policy cannot learn one fixed answer."""
    env = ScriptEnv(PARAMS)
    tasks = env.generate(190, seed=1, split="train")
    for family in FAMILIES:
        answers = Counter(json.dumps(t.checks["expected"], sort_keys=True) for t in tasks if t.kind == family.name)
        assert len(answers) == sum(answers.values()), family.name



class TestChatReplies:
    """An instruct model's reply: its ```python block is run after the prompt (envs/extraction.py)."""

    @pytest.mark.parametrize("wrap", [
        lambda t: f"Here is a script that does it:\n\n```python\nimport os\n\n{t.reference}```\n\nRun it in the folder.",
        lambda t: f"```bash\nls\n```\nThen:\n```python\n{t.reference}```",  # the python block, not the shell one
    ])
    def test_a_fenced_reference_passes_like_the_raw_one(self, env, tasks, pool, reference_verdicts, wrap):
        chosen = list(range(0, len(tasks), max(1, len(tasks) // 12)))
        verdicts = env.verify_batch([tasks[i] for i in chosen], [wrap(tasks[i]) for i in chosen], pool)
        for i, verdict in zip(chosen, verdicts):
            raw = reference_verdicts[i]
            assert verdict.passed and verdict.components == raw.components, (tasks[i].reference, verdict)
            assert verdict.steps == {"extract": "fenced", **raw.steps} and list(verdict.steps)[0] == "extract"

    def test_a_broken_fence_fails_at_the_extract_step_and_runs_nothing(self, env, tasks, pool):
        task = tasks[0]
        verdict = env.verify(task, f"Here:\n```python\n{task.reference}", pool)
        assert verdict.failed_step == "extract" and verdict.status == "format_error" and not verdict.passed
        assert verdict.feedback == "extract: the ``` fence opened on line 2 is never closed (was the reply cut off?)"
        assert verdict.components == {"syntax": 0.0, "runs": 0.0, "files": 0.0} and verdict.timing == {}
        assert list(verdict.steps)[:2] == ["extract", "parses"] and not any(verdict.steps.values())

    def test_an_empty_block_is_not_run(self, env, tasks, pool):
        verdict = env.verify(tasks[0], "```python\n\n```", pool)
        assert verdict.failed_step == "extract" and "empty" in verdict.feedback
