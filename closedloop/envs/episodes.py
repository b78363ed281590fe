"""Visible and hidden checks of a task, and the feedback a model may read between the rounds of an episode.

An episode verifies each attempt against the task's VISIBLE checks and shows the model what they said;
its reward comes from the HIDDEN checks, whose expected values no feedback ever shows (RLEF: public
tests as feedback, private tests as reward). Two optional methods of an environment say how:

``split_checks(task) -> (visible checks, hidden checks) | None``
    None: nothing to hold back, the reward reuses the visible checks (``held_back`` False). The same
    dict on both sides: one input that cannot be partitioned, whose expected values the environment's
    shown feedback never quotes (``held_back`` True).
``shown_feedback(task, verdict) -> str``
    What the model may read of a verdict on the visible checks. ``task`` is the episode's task or its
    visible part (episode_checks(env, task).visible): a split of the visible part gives it back whole.

An environment without them (a user's) gets visible = hidden = the task, ``held_back`` False, and a
feedback that says only the verdict's status and failed step ("failed at step runs (runtime_error)"),
never ``verdict.feedback``, which may quote expected values. A verdict the sandbox could not judge
(status ``infra_error``) reads the same for every environment.

The built-in environments (each module's docstring says the same of its own):

- code: the first ``checks.visible`` calls are visible (a task file may set it; default half the
  calls, at least one), the rest hidden. With one call, or ``visible`` covering every call, nothing is
  held back. The feedback may show a failing visible call with its returned and expected value, or
  the exception's last line; a load or limit failure's last line. A HumanEval-format test program
  cannot be split: the same checks both sides, and the feedback says the status and the exception's
  type only, never the test's assertion text.
- data: one input, no partition (held back). The feedback may show the exception's last line, the
  columns the result has (the expected ones too when the prompt names them all), a column whose dtype
  is wrong, how many rows came back, and the position and value got of the first differing cell;
  never an expected cell, dtype or row count.
- script: one input, no partition (held back). The feedback may show the exception's last line, a
  missing path when the prompt or the starting tree names it, an unexpected path (the script made
  it), and a differing file's path with the content the script wrote; never expected content.
- extract: no partition (held back): a truth restricted to some fields would count the others as
  wrong (field precision is over every field the answer gives). The feedback may show a JSON or
  schema error (the schema is the prompt's field list) and which field is wrong, with the value the
  answer gave; never the document's value.
- rules: no partition (held back). The feedback may show a format error (which line, in what form)
  and how many of the rule conclusions and the decision are wrong; never which, nor a right verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from closedloop.envs.base import Task, Verdict

NOT_JUDGED = "not judged: the sandbox failed to run the attempt (not the attempt's fault)"
PASSED = "passed the visible checks"
ERROR_CHARS = 200  # cap on an error line the feedback quotes


@dataclass(frozen=True)
class EpisodeChecks:
    """What an episode verifies each attempt against, and what decides its reward."""

    visible: Task  # verified after every round; its verdict, passed through shown_feedback, is what the model reads
    hidden: Task  # the checks that decide the reward (verified on each round's attempt for the per-round curve)
    held_back: bool  # True when `hidden` holds checks whose expected values no feedback ever shows; False when the task had nothing to hold back and the reward reuses the visible checks


def episode_checks(env: Any, task: Task) -> EpisodeChecks:
    """The task's visible and hidden checks, by the environment's ``split_checks`` (none: the task both ways)."""
    split = getattr(env, "split_checks", None)
    parts = split(task) if split is not None else None
    if parts is None:
        return EpisodeChecks(visible=task, hidden=task, held_back=False)
    visible, hidden = parts
    return EpisodeChecks(visible=_with_checks(task, visible), hidden=_with_checks(task, hidden), held_back=True)


def _with_checks(task: Task, checks: dict[str, Any]) -> Task:
    return task if checks is task.checks else replace(task, checks=checks)


def shown_feedback(env: Any, task: Task, verdict: Verdict) -> str:
    """The feedback text the model may read, from a verdict of episode_checks(env, task).visible: only
    what the environment says may be shown. Never contains a value that is only in the hidden checks."""
    if verdict.status == "infra_error":
        return NOT_JUDGED
    own = getattr(env, "shown_feedback", None)
    return own(task, verdict) if own is not None else status_only(verdict)


def status_only(verdict: Verdict) -> str:
    """What any verdict may show: passed, or its status and failed step."""
    if verdict.passed:
        return PASSED
    if verdict.failed_step:
        return f"failed at step {verdict.failed_step} ({verdict.status})"
    return f"failed ({verdict.status})"


def error_line(text: str) -> str:
    """An error's last non-blank line (a traceback's exception), cut at ERROR_CHARS."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."


def exception_type(text: str) -> str:
    """The exception class an error message starts with ("AssertionError: ..." → "AssertionError"),
    after a ``test line N:`` prefix; "" when it starts with none."""
    found = re.match(r"(?:test line \d+: )?([A-Za-z_][\w.]*)(?::|$)", error_line(text))
    return found.group(1) if found else ""


def is_named(name: str, text: str) -> bool:
    """Whether ``text`` (a prompt) names ``name`` as a word of its own: between spaces, commas, quotes,
    parentheses or a line's '#', a trailing '.' or '/' aside. So 'b.txt' is not named by 'ab.txt'."""
    words = set()
    for word in re.split(r"[\s,;:()\[\]{}'\"`#=]+", text):
        words.update({word, word.rstrip("."), word.rstrip("/"), word.rstrip("./")})
    return name in words


def between(text: str, prefix: str, suffix: str) -> str | None:
    """What lies between ``prefix`` and ``suffix`` when ``text`` is exactly prefix + middle + suffix, else None."""
    if len(text) >= len(prefix) + len(suffix) and text.startswith(prefix) and text.endswith(suffix):
        return text[len(prefix): len(text) - len(suffix)]
    return None
