"""Visible and hidden checks of an episode (envs/episodes.py): a value put only in the hidden checks of
every built-in environment never reaches the feedback a model reads, on real verdicts of real sandbox
runs; the code environment's split of its calls; the defaults of a user's environment; and
``checks.visible`` in a code task file."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from closedloop.config import Params
from closedloop.envs import ENVIRONMENTS, get_env
from closedloop.envs.base import BaseEnvironment, Task, Verdict
from closedloop.envs.episodes import NOT_JUDGED, PASSED, EpisodeChecks, episode_checks, shown_feedback
from closedloop.envs.humaneval import TaskFileError
from closedloop.envs.rules import RuleEngine
from closedloop.envs.rules_tasks import render_prompt
from closedloop.envs.taskfile import load_any
from closedloop.rewards.pools import EnvPools

SENTINEL = "SENTINEL"  # every mark starts with it; no generated task holds it otherwise
N_TASKS = 40
PARAMS = Params()


@pytest.fixture(scope="module")
def envs():
    return {name: get_env(name, PARAMS) for name in ENVIRONMENTS}


@pytest.fixture(scope="module")
def pools():
    with EnvPools(PARAMS, sandbox_workers=2) as shared:
        yield shared


@pytest.fixture(scope="module")
def tasks(envs):
    return {name: env.generate(N_TASKS, 0, "train") for name, env in envs.items()}


# -- the sentinel: hidden values never shown --------------------------------------------------------


def marked(name: str, env, task: Task, mark: str) -> Task:
    """``task`` with ``mark`` in every hidden expected value (rules: the right decision is ``mark``)."""
    checks = copy.deepcopy(task.checks)
    if name == "code":
        count = len(episode_checks(env, task).visible.checks["calls"])
        checks["expected"][count:] = [f"{mark}-{j}" for j in range(count, len(checks["expected"]))]
    elif name == "data":
        rows = checks["expected"]["rows"]
        checks["expected"]["rows"] = [[f"{mark}-{r}-{c}" for c in range(len(row))] for r, row in enumerate(rows)]
    elif name == "script":
        checks["expected"] = {path: f"{mark}\n{text}" for path, text in checks["expected"].items()}
    elif name == "extract":
        checks["truth"] = {key: f"{mark}-{key}" for key in checks["truth"]}
    else:  # rules: rename the right outcome everywhere, so the prompt (regenerated) stays consistent
        spec = checks["spec"]
        decision = RuleEngine.evaluate(spec).decision
        for rule in spec["rules"]:
            rule["then"] = mark if rule["then"] == decision else rule["then"]
        spec["default"] = mark if spec["default"] == decision else spec["default"]
        reference = task.reference.rstrip("\n").rsplit("\n", 1)[0] + f"\ndecision: {mark}\n"
        return replace(task, prompt=render_prompt(spec), checks=checks, reference=reference)
    return replace(task, checks=checks)


def one_change(name: str, task: Task) -> list[str]:
    """Near misses of the reference: what a model's second attempt often is."""
    reference = task.reference
    if name == "code":
        return [reference.replace("return ", "return (", 1).rstrip("\n") + ") * 2\n"]
    if name == "data":
        body = reference.replace("return ", "", 1).strip()
        return [f"    return ({body}).head(1)\n", f"    return ({body}).iloc[::-1]\n",
                f"    return ({body}).iloc[:, ::-1]\n"]
    if name == "script":
        return [reference + "open('extra.txt', 'w').write('x')\n", reference + "os.remove(sorted(os.listdir('.'))[0])\n"]
    if name == "extract":
        truth = json.loads(reference)
        first = next(iter(truth))
        return [json.dumps({**truth, first: "nobody"}) + "\n", json.dumps({**truth, "note": "x"}) + "\n"]
    lines = reference.rstrip("\n").split("\n")
    flipped = lines[0][:-3] + "no" if lines[0].endswith("yes") else lines[0][:-2] + "yes"
    return ["\n".join([flipped] + lines[1:]) + "\n", "\n".join(lines[:-1] + ["decision: other"]) + "\n",
            "\n".join(lines[1:]) + "\n"]


# What each environment's wrong attempts add to: blank, another task's reference, the reference, near
# misses, broken syntax, and an attempt that raises (quoting what it can reach).
BROKEN = {
    "code": ["    return (\n", "    raise ValueError(repr(list(locals().values())))\n"],
    "data": ["    return df[\n", "    raise KeyError(str(df.columns.tolist()) + str(df.iloc[0].tolist()))\n"],
    "script": ["if (:\n", "raise RuntimeError(open(sorted(os.listdir('.'))[0]).read())\n"],
    "extract": ['{"a": ', "The fields are unknown.", "[1, 2]"],
    "rules": ["R1 maybe\n", "decision: maybe\n", "R1: yes\nR2: yes\nR3: yes\nR4: yes\nR5: yes\ndecision: x\nmore\n"],
}

# A HumanEval-format task whose test program's assertion messages hold the mark.
HUMANEVAL = Task(task_id="code/humaneval-sentinel", env="code", split="train", slice="core", kind="humaneval",
                 prompt='def f(x):\n    """Twice x."""\n', entry_point="f", reference="    return x * 2\n",
                 checks={"test": "def check(candidate):\n    assert candidate(1) == 2, 'SENTINEL-he 2'\n"
                                 "    assert candidate(2) == 4, 'SENTINEL-he 4'\n"})


def attempts(name: str, tasks: list[Task]) -> list[tuple[Task, str]]:
    pairs = []
    for i, task in enumerate(tasks):
        other = tasks[(i + 1) % len(tasks)]
        for completion in ["", other.reference, task.reference, *one_change(name, task), *BROKEN[name]]:
            pairs.append((task, completion))
    if name == "code":
        pairs += [(HUMANEVAL, c) for c in ("    return x\n", "    return 'SENTINEL'[:0]\n", "    raise TypeError\n",
                                           "    return (\n", HUMANEVAL.reference)]
    return pairs


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_a_value_only_in_the_hidden_checks_never_reaches_the_feedback(name, envs, pools, tasks):
    env = envs[name]
    assert not [t.task_id for t in tasks[name] if SENTINEL in json.dumps(t.to_record())]
    marked_tasks = [marked(name, env, task, f"{SENTINEL}{i:03d}x") for i, task in enumerate(tasks[name])]
    pairs = attempts(name, marked_tasks)
    checks = [episode_checks(env, task) for task, _ in pairs]
    assert all(c.held_back for c in checks), "every task of a built-in environment holds its expected values back"
    completions = [completion for _, completion in pairs]
    visible = pools.verify_batch(name, [c.visible for c in checks], completions)
    hidden = pools.verify_batch(name, [c.hidden for c in checks], completions)
    shown = [shown_feedback(env, c.visible, v) for c, v in zip(checks, visible)]
    # Even a verdict of the hidden checks, shown by mistake, is told without their values.
    shown += [shown_feedback(env, task, v) for (task, _), v in zip(pairs, hidden)]
    leaks = [(pairs[i % len(pairs)][1], text) for i, text in enumerate(shown) if SENTINEL in text]
    assert not leaks, f"{name}: the feedback shows a hidden value: {leaks[:3]}"
    # The redaction matters: the verdicts' own feedback does quote the hidden values...
    quoted = sum(SENTINEL in v.feedback for v in hidden)
    assert quoted >= N_TASKS // 2, f"{name}: only {quoted} verdicts quote a hidden value; the test proves nothing"
    if name == "code":  # ...except where the visible checks never held them
        assert not [v.feedback for v in visible if SENTINEL in v.feedback and "test line" not in v.feedback]
    assert all(text.strip() for text in shown)
    # ...and what is shown still says where the attempt went wrong, not only that it did.
    informative = {"code": " returned ", "data": "step values: cell (", "script": ": content ",
                   "extract": "fields: field ", "rules": " of "}[name]
    assert any(informative in text for text in shown), f"{name}: no feedback says {informative!r}: {shown[:10]}"


# -- the split ------------------------------------------------------------------------------------


def test_the_code_split_partitions_the_calls(envs, tasks):
    env = envs["code"]
    for task in tasks["code"]:
        parts = episode_checks(env, task)
        calls, expected = task.checks["calls"], task.checks["expected"]
        count = max(1, len(calls) // 2)
        assert parts.held_back
        assert parts.visible.checks["calls"] == calls[:count] and parts.hidden.checks["calls"] == calls[count:]
        assert parts.visible.checks["expected"] + parts.hidden.checks["expected"] == expected
        assert parts.visible.prompt == parts.hidden.prompt == task.prompt
        # The visible part is whole: splitting it again (as shown_feedback may) gives it back.
        assert episode_checks(env, parts.visible) == EpisodeChecks(parts.visible, parts.visible, False)


@pytest.mark.parametrize("count, held_back", [
    (1, False),  # one call: nothing to hold back, the reward reuses it
    (2, True),  # the first call visible, the second hidden
    (3, True),  # one visible (3 // 2), two hidden
])
def test_the_number_of_calls_decides_what_is_held_back(envs, tasks, count, held_back):
    task = tasks["code"][0]
    task = replace(task, checks={"calls": task.checks["calls"][:count], "expected": task.checks["expected"][:count]})
    parts = episode_checks(envs["code"], task)
    assert parts.held_back is held_back
    if not held_back:
        assert parts.visible == parts.hidden == task
    else:
        assert len(parts.visible.checks["calls"]) == max(1, count // 2)


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_the_reference_passes_the_visible_and_the_hidden_checks(name, envs, pools, tasks):
    checks = [episode_checks(envs[name], task) for task in tasks[name]]
    references = [task.reference for task in tasks[name]]
    for part in ("visible", "hidden"):
        verdicts = pools.verify_batch(name, [getattr(c, part) for c in checks], references)
        failed = [(t.task_id, v.feedback) for t, v in zip(tasks[name], verdicts) if not v.passed]
        assert not failed, f"{name}: the reference fails the {part} checks: {failed[:3]}"
        shown = [shown_feedback(envs[name], c.visible, v) for c, v in zip(checks, verdicts)]
        assert all(text.startswith("passed") for text in shown), shown[:3]


def test_answers_hard_coded_for_the_visible_calls_fail_the_hidden_ones(envs, pools, tasks):
    env = envs["code"]
    checks = [episode_checks(env, task) for task in tasks["code"]]
    # The visible calls' answers looked up by the arguments: right where the model was shown, KeyError elsewhere.
    completions = [f"    return {dict(zip(map(repr, c.visible.checks['calls']), c.visible.checks['expected']))!r}"
                   "[repr(list(locals().values()))]\n" for c in checks]
    visible = pools.verify_batch("code", [c.visible for c in checks], completions)
    hidden = pools.verify_batch("code", [c.hidden for c in checks], completions)
    assert all(v.passed for v in visible), [v.feedback for v in visible if not v.passed][:3]
    assert not any(v.passed for v in hidden)
    assert shown_feedback(env, checks[0].visible, visible[0]).startswith("passed the ")


# -- shown feedback on verdicts made by hand --------------------------------------------------------


def _verdict(feedback: str, status: str = "failed", failed_step: str | None = "tests_passed", **steps) -> Verdict:
    return Verdict(components={}, steps=steps, passed=status == "passed", feedback=feedback, status=status,
                   failed_step=failed_step)


@pytest.mark.parametrize("feedback, status, step, shown", [
    # a visible call: shown as the verdict says it, with its expected value
    ("f([4, 3, 2]) returned 0, expected 1", "failed", "tests_passed", "f([4, 3, 2]) returned 0, expected 1"),
    # a hidden call (a verdict of the wrong checks): nothing of it
    ("f([3, -4, 8]) returned 0, expected 1", "failed", "tests_passed", "failed at step tests_passed (failed)"),
    # a visible call that raised: the exception's last line
    ("f([3]) raised ValueError: no", "runtime_error", "runs", "f([3]) raised ValueError: no"),
    # a program that did not load: the error's last line
    ("NameError: name 'g' is not defined", "runtime_error", "runs",
     "failed at step runs (runtime_error): NameError: name 'g' is not defined"),
])
def test_code_shows_visible_calls_only(envs, tasks, feedback, status, step, shown):
    task = next(t for t in tasks["code"] if t.checks["calls"][0] == [[4, 3, 2]])
    visible = episode_checks(envs["code"], task).visible
    assert shown_feedback(envs["code"], visible, _verdict(feedback, status, step)) == shown
    assert shown_feedback(envs["code"], task, _verdict(feedback, status, step)) == shown


@pytest.mark.parametrize("feedback, shown", [
    ("test line 3: AssertionError: expected 5, got 4", "failed at step tests_passed (failed): AssertionError"),
    ("the test did not complete", "failed at step tests_passed (failed)"),
])
def test_a_test_program_shows_the_exception_type_only(envs, feedback, shown):
    assert shown_feedback(envs["code"], HUMANEVAL, _verdict(feedback)) == shown


def test_a_verdict_the_sandbox_could_not_judge_reads_the_same_everywhere(envs, tasks):
    infra = _verdict("not judged (sandbox infrastructure error, not the completion's fault): boom", "infra_error", None)
    assert {shown_feedback(env, tasks[name][0], infra) for name, env in envs.items()} == {NOT_JUDGED}


# -- a user's environment ---------------------------------------------------------------------------


class Answer(BaseEnvironment):
    """A user's environment without the hooks: its feedback quotes the expected answer."""

    name = "answer"
    uses_sandbox = False
    components = ("right",)
    default_weights = {"right": 1.0}  # noqa: RUF012 - as the built-in environments declare theirs

    def verify_batch(self, tasks, completions, pool=None):
        return [Verdict(components={"right": float(c == t.checks["answer"])}, steps={"runs": c == t.checks["answer"]},
                        passed=c == t.checks["answer"], feedback=f"expected {t.checks['answer']!r}",
                        status="passed" if c == t.checks["answer"] else "runtime_error",
                        failed_step=None if c == t.checks["answer"] else "runs") for t, c in zip(tasks, completions)]

    def component_sources(self):
        return {"right": (Answer.verify_batch, {})}


class SplitAnswer(Answer):
    """The same with only a split: its second answer is hidden."""

    def split_checks(self, task):
        return {"answer": task.checks["answer"]}, {"answer": task.checks["hidden"]}


USER_TASK = Task(task_id="answer/1", env="answer", split="train", slice="core", kind="answer", prompt="Say 42.",
                 entry_point="", checks={"answer": "42", "hidden": "SENTINEL-user"}, reference="42")


def test_a_user_environment_without_the_hooks_gets_the_task_both_ways_and_only_its_status():
    env = Answer()
    assert episode_checks(env, USER_TASK) == EpisodeChecks(visible=USER_TASK, hidden=USER_TASK, held_back=False)
    wrong, right = env.verify_batch([USER_TASK, USER_TASK], ["41", "42"])
    assert "42" in wrong.feedback  # what the default must not show
    assert shown_feedback(env, USER_TASK, wrong) == "failed at step runs (runtime_error)"
    assert shown_feedback(env, USER_TASK, right) == PASSED
    assert shown_feedback(env, USER_TASK, replace(wrong, failed_step=None)) == "failed (runtime_error)"


def test_a_user_environment_with_a_split_holds_back_its_hidden_checks():
    env = SplitAnswer()
    parts = episode_checks(env, USER_TASK)
    assert parts.held_back
    assert parts.visible.checks == {"answer": "42"} and parts.hidden.checks == {"answer": "SENTINEL-user"}
    assert parts.visible.task_id == parts.hidden.task_id == USER_TASK.task_id
    verdict = env.verify_batch([parts.hidden], ["41"])[0]
    assert SENTINEL in verdict.feedback and SENTINEL not in shown_feedback(env, parts.visible, verdict)


# -- checks.visible in a code task file ------------------------------------------------------------


def _write(path, record: dict):
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return path


def test_checks_visible_in_a_task_file_is_honoured(envs, tasks, tmp_path):
    record = tasks["code"][0].to_record()
    calls = record["checks"]["calls"]
    for count in (1, 2, len(calls)):
        path = _write(tmp_path / f"visible-{count}.jsonl", {**record, "checks": {**record["checks"], "visible": count}})
        (task,) = load_any(path, "code")
        parts = episode_checks(envs["code"], task)
        assert parts.visible.checks["calls"] == calls[:count]
        assert parts.held_back is (count < len(calls))
        assert parts.hidden.checks["calls"] == (calls[count:] if count < len(calls) else calls)
        assert "visible" not in parts.hidden.checks or not parts.held_back


@pytest.mark.parametrize("value, problem", [
    (0, "checks.visible must be an integer from 1 to the number of calls (6), got 0"),  # no call visible
    (7, "checks.visible must be an integer from 1 to the number of calls (6), got 7"),  # more than there are
    (-1, "checks.visible must be an integer from 1 to the number of calls (6), got -1"),
    ("2", "checks.visible must be an integer, got str"),  # a string, as a hand-written file might hold
    (True, "checks.visible must be an integer, got bool"),  # JSON true is no count
    (2.0, "checks.visible must be an integer, got float"),
])
def test_a_bad_checks_visible_is_refused_by_file_line_and_field(tasks, tmp_path, value, problem):
    record = tasks["code"][0].to_record()
    assert len(record["checks"]["calls"]) == 6
    path = _write(tmp_path / "bad.jsonl", {**record, "checks": {**record["checks"], "visible": value}})
    with pytest.raises(TaskFileError) as refused:
        load_any(path, "code")
    assert str(refused.value) == f"{path}:1: task {record['task_id']!r}: {problem}"


def test_checks_visible_beside_a_test_program_is_refused(tmp_path):
    record = {**HUMANEVAL.to_record(), "checks": {**HUMANEVAL.checks, "visible": 1}}
    with pytest.raises(TaskFileError, match="checks.visible splits calls; a test program"):
        load_any(_write(tmp_path / "he.jsonl", record), "code")
