"""The script environment: write a short Python script that reshapes a small file tree.

The prompt lists the starting files and states a goal (rename, move, filter lines, count log lines
into a report, concatenate, delete, append, copy); the policy continues it with a script. The script
runs in the sandbox, in a job directory holding the starting files, with exec allowed (scripts may
run programs through subprocess); the sandbox reports the resulting tree and the verifier diffs it
with the expected one, which script_tasks computed from the spec in plain Python.

Steps, in order: parses → exits_cleanly (ran to its end or sys.exit(0)) → files_match (the fraction
of paths in the expected and resulting trees that are right), then one ``file:<path>`` step per path
in either tree, sorted: True where the file is as expected, False where it differs, is missing or
should not be there. A task passes when every path matches. A chat reply's script is read first
(envs/extraction.py: its first ```python block, run after the prompt), and its steps then start
with ``extract``.

In an episode (envs/episodes.py) a task's one starting tree cannot be partitioned: its checks are
verified whole, and the model reads the error's last line, a missing path when the prompt or the
starting tree names it, an unexpected path (the script made it), and a differing file's path with the
content the script wrote, never the expected content.

Splits are disjoint by construction: a task belongs to the benchmark iff the hash of what it asks
falls in base's fixed bucket. What it asks is all the prompt says: the operation, its arguments and
the starting file names. File contents are hidden test data (the same script must handle any), so two
tasks differing only in contents are one task, and never one in each split.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypedDict

from closedloop.envs import extraction
from closedloop.envs.base import (
    HELDOUT,
    TRAINED_SLICES,
    BaseEnvironment,
    Task,
    Verdict,
    check_split,
    draw_until,
    in_benchmark,
    not_judged,
    round_robin,
    source_of,
    stable_hash,
)
from closedloop.envs.episodes import between, error_line, is_named, status_only
from closedloop.envs.extraction import Extraction, extract_program
from closedloop.envs.script_tasks import FAMILIES, Family, expected_tree, prompt_of, reference_of
from closedloop.envs.taskfile import file_tree_problems
from closedloop.sandbox.records import ExecResult, Job, Limits

if TYPE_CHECKING:
    from closedloop.config import ScriptEnvParams
    from closedloop.sandbox.pool import SandboxPool

COMPONENTS = ("syntax", "runs", "files")
STEPS = ("parses", "exits_cleanly", "files_match")  # then "file:<path>" per path, sorted
MAX_PROMPT_CHARS = 500  # the tiny policy's context is 512 tokens; its completion needs room too
MAX_REFERENCE_CHARS = 200
MAX_FILES = 6  # starting files per task: small trees the prompt can list
_TEXT_CHARS = 60  # cap on one file's content quoted in feedback


def _short(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= _TEXT_CHARS else shown[: _TEXT_CHARS - 4] + "...'"


def compare_trees(expected: dict[str, str], got: dict[str, str]) -> tuple[dict[str, bool], str]:
    """({path: matches} for every path of either tree, sorted; the first difference as feedback, "" if none).

    Partial credit counts a file that should not be there like one that is wrong or missing, so a
    script that leaves originals behind or copies instead of moving loses credit for each.
    """
    states: dict[str, bool] = {}
    first = ""
    for path in sorted(set(expected) | set(got)):
        states[path] = path in expected and path in got and expected[path] == got[path]
        if states[path] or first:
            continue
        if path not in got:
            first = f"missing {path}"
        elif path not in expected:
            first = f"unexpected file {path}"
        else:
            first = f"{path}: content {_short(got[path])} expected {_short(expected[path])}"
    return states, first


def files_credit(start: dict[str, str], expected: dict[str, str], states: dict[str, bool]) -> float:
    """The share of what the task asked that the script did: the paths it changes right, over the
    paths it changes plus the paths the script broke that it should have left alone.

    Credit only for what the task asked to change: a path whose starting and expected content are
    the same earns nothing for being left as it was (a script that does nothing scores 0), but
    costs when the script gets it wrong. A task that asks for no change earns 1 only untouched.
    """
    asked = {path for path in set(start) | set(expected) if start.get(path) != expected.get(path)}
    done = sum(states.get(path, True) for path in asked)  # a path in neither tree was deleted as asked
    broken = sum(not ok for path, ok in states.items() if path not in asked)
    return done / (len(asked) + broken) if asked or broken else 1.0


def task_key(spec: dict[str, Any]) -> str:
    """The hash of what a task asks: its operation, arguments and starting file names, not their contents."""
    return stable_hash({"op": spec["op"], "args": spec["args"], "paths": sorted(spec["start"])})


def benchmark_slice(key: str) -> str:
    """The one benchmark slice a task key may appear in: a fixed third of the hash space each."""
    return TRAINED_SLICES[int(key[8:16], 16) % len(TRAINED_SLICES)]


class ScriptChecks(TypedDict):
    """What the verifier reads of a task's checks (the spec's op and args ride along, unread)."""

    start: dict[str, str]  # the starting tree: relative path -> content, placed in the job directory
    expected: dict[str, str]  # the tree the script must leave


class ScriptEnv(BaseEnvironment):
    name = "script"
    uses_sandbox = True
    # Worker-side imports scripts commonly make (os and shutil the worker has already).
    sandbox_preload: tuple[str, ...] = ("glob", "pathlib", "csv", "subprocess")
    components = COMPONENTS
    # Parsing and a clean exit earn a little; the resulting tree earns most of the reward.
    default_weights = {"syntax": 0.1, "runs": 0.1, "files": 0.8}

    task_checks = ScriptChecks

    def __init__(self, params: ScriptEnvParams) -> None:
        self.params = params

    @staticmethod
    def check_task(task: Task) -> list[str]:
        """Every path of the starting file tree (``checks.start``) must be a relative path inside the
        sandbox job's directory, as the sandbox places files."""
        return file_tree_problems(task.checks["start"], "checks.start")

    def component_sources(self) -> dict[str, tuple[Any, Any]]:
        config = {"sandbox": self.params.sandbox.model_dump(mode="json"), "extraction": extraction.version()}
        return {"syntax": (_judge, config), "runs": (_judge, config),
                "files": (compare_trees, {**config, "credit": source_of(files_credit)})}

    # -- episodes (envs/episodes.py) -------------------------------------------------------------

    def split_checks(self, task: Task) -> tuple[dict[str, Any], dict[str, Any]]:
        """One starting tree, so no partition: the same checks both ways, whose expected contents no feedback shows."""
        return task.checks, task.checks

    def shown_feedback(self, task: Task, verdict: Verdict) -> str:
        """The error's last line for a script that did not parse or exit cleanly; for a wrong tree, the
        first differing path: its name when the task names it or the script made it, and the content the
        script wrote, never the expected content."""
        if verdict.passed:
            return f"passed the visible checks: all {len(task.checks['expected'])} files match"
        if verdict.status == "format_error":
            return verdict.feedback  # how the reply was read, or that it was blank: nothing of the checks
        if verdict.failed_step in ("parses", "exits_cleanly"):
            return f"{status_only(verdict)}: {error_line(verdict.feedback)}"
        expected, start = task.checks["expected"], task.checks["start"]
        for path in expected:
            if verdict.feedback == f"missing {path}":
                named = path in start or all(is_named(part, task.prompt) for part in path.split("/"))
                return verdict.feedback if named else "a file the task asks for is missing"
            content = between(verdict.feedback, f"{path}: content ", f" expected {_short(expected[path])}")
            if content is not None:
                return f"{path}: content {content} is not what the task asks for"
        unexpected = between(verdict.feedback, "unexpected file ", "")
        if unexpected is not None and unexpected not in expected:
            return verdict.feedback  # a path the script made: no expected value in it
        return status_only(verdict)

    # -- generation ------------------------------------------------------------------------------

    def generate(self, n: int, seed: int, split: str, slice: str = "core") -> list[Task]:
        """``n`` distinct tasks, families in round robin: train mixes every family, each benchmark
        slice draws only its own."""
        check_split(self.name, split, slice, n)
        families = [f for f in FAMILIES if (f.slice != HELDOUT if split == "train" else f.slice == slice)]
        rng = random.Random(f"script/{split}/{seed}" + ("" if split == "train" else f"/{slice}"))
        seen: set[str] = set()
        return round_robin(self.name, families, n, lambda family: self._draw(family, rng, split, seen),
                           split=split, slice=slice)

    def _draw(self, family: Family, rng: random.Random, split: str, seen: set[str]) -> Task | None:
        def attempt() -> Task | None:
            spec = family.sample(rng)
            key = task_key(spec)
            held_out = family.slice == HELDOUT  # its operation is one no train family asks: all its space
            if key in seen or (not held_out and in_benchmark(key) != (split == "benchmark")):
                return None
            if split == "benchmark" and not held_out and benchmark_slice(key) != family.slice:
                return None  # families of different slices share operations: no prompt is in two slices
            expected = expected_tree(spec)
            prompt, reference = prompt_of(spec), reference_of(spec)
            too_big = len(spec["start"]) > MAX_FILES or len(prompt) > MAX_PROMPT_CHARS or len(reference) > MAX_REFERENCE_CHARS
            if expected is None or too_big:
                return None
            seen.add(key)
            return Task(
                task_id=f"{self.name}/{split}/{family.slice}/{key[:10]}",
                env=self.name,
                split=split,
                slice=family.slice,
                kind=family.name,
                prompt=prompt,
                entry_point="",
                checks={**spec, "expected": expected},  # op, args, start: the spec
                reference=reference,
            )

        return draw_until(attempt)

    # -- verification ----------------------------------------------------------------------------

    def verify_batch(self, tasks: list[Task], completions: list[str], pool: SandboxPool) -> list[Verdict]:
        """One script job per non-blank completion whose script could be read (program = prompt +
        completion, or prompt + a chat reply's ```python block); never raises on bad output."""
        self.check_batch(tasks, completions)
        limits = Limits.of(self.params.sandbox)  # exec allowed, whatever limits the pool was built with
        read = [extract_program(c, t.prompt) for t, c in zip(tasks, completions)]
        verdicts: list[Verdict | None] = [
            _not_extracted(t, r) if r.failed else _blank(t) if not c.strip() else None
            for t, c, r in zip(tasks, completions, read)]
        todo = [i for i, v in enumerate(verdicts) if v is None]
        jobs = [Job(read[i].text, "", files=tasks[i].checks["start"], limits=limits, collect_files=True) for i in todo]
        for i, result in zip(todo, pool.run(jobs) if jobs else []):
            verdict = _judge(tasks[i], result)
            verdicts[i] = replace(verdict, steps={**read[i].steps, **verdict.steps}) if read[i].steps else verdict
        return verdicts  # type: ignore[return-value]


def _file_steps(expected: dict[str, str], states: dict[str, bool] | None) -> dict[str, bool]:
    """The per-file steps; when the script did not finish, every expected file counts as not reached."""
    if states is None:
        return {f"file:{path}": False for path in sorted(expected)}
    return {f"file:{path}": ok for path, ok in states.items()}


def _failed(task: Task, parses: bool, status: str, feedback: str, failed_step: str, timing: dict[str, float]) -> Verdict:
    steps = {"parses": parses, "exits_cleanly": False, "files_match": 0.0, **_file_steps(task.checks["expected"], None)}
    # Nothing of the task was done, so parsing earns nothing either (the steps still say it parsed).
    return Verdict(components={"syntax": 0.0, "runs": 0.0, "files": 0.0}, steps=steps, passed=False,
                   feedback=feedback, status=status, timing=timing, failed_step=failed_step)


def _not_extracted(task: Task, extraction: Extraction) -> Verdict:
    """The verdict of a reply no script could be read from: nothing ran."""
    verdict = _failed(task, False, "format_error", extraction.feedback, "extract", {})
    return replace(verdict, steps={**extraction.steps, **verdict.steps})


def _blank(task: Task) -> Verdict:
    # Not run: an empty script would leave the starting tree as it is and earn credit for doing nothing.
    return _failed(task, False, "format_error", "empty completion: no script was written", "parses", {})


def _judge(task: Task, result: ExecResult) -> Verdict:
    timing = {"wall_s": result.wall_s}
    if result.status == "infra_error":
        return replace(not_judged(COMPONENTS, STEPS, result.error), timing=timing)
    parses = bool(result.steps.get("parses"))
    if result.status == "error" and not parses:
        return _failed(task, False, "syntax_error", result.error, "parses", timing)
    if result.status != "completed" or result.files is None:
        # An exception or nonzero exit (status error), killed, timeout, memory, output_limit.
        # A limit hit fails the script under that limit's name, whatever its tree looked like.
        limits = ("timeout", "memory", "output_limit", "process_limit")
        status = result.status if result.status in limits else "runtime_error"
        feedback = result.error or f"the script ended with status {result.status}"
        if result.status == "output_limit":
            feedback = f"printed or wrote more than the sandbox's output cap ({result.error})"
        elif result.status == "completed":  # ran, but no tree came back (a result the worker rejected)
            feedback = "the script ran but its files could not be read back"
        return _failed(task, True, status, feedback, "exits_cleanly", timing)
    expected = task.checks["expected"]
    states, difference = compare_trees(expected, result.files)
    fraction = files_credit(task.checks["start"], expected, states)
    passed = all(states.values())
    steps = {"parses": True, "exits_cleanly": True, "files_match": fraction, **_file_steps(expected, states)}
    # Gated on the task: parsing and running earn nothing for a script that did none of what was asked.
    gate = 1.0 if fraction > 0 else 0.0
    return Verdict(
        components={"syntax": gate, "runs": gate, "files": fraction},
        steps=steps,
        passed=passed,
        feedback=f"all {len(states)} files match" if passed else difference,
        status="passed" if passed else "failed",
        timing=timing,
        failed_step=None if passed else "files_match",
    )
