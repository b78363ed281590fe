"""Review answers: validated, queued in an inbox, merged into the labels file once per iteration.

Answers arrive at any time (the review flow, an API, `closedloop review`), also while an iteration
runs. They are appended to an inbox (data/labels/inbox.jsonl, neither DVC- nor git-tracked) under an
flock; `merge_inbox`, called at the start of an iteration under the workspace lock, moves them into
data/labels/human.jsonl and data/labels/known_hacks.jsonl before those are `dvc add`ed. So the reward
stage's inputs never change while an iteration runs.

An inbox row is a label row (the shared contract of human.jsonl) plus ``sample``: the prompt,
completion and task the reviewer saw. The merge strips it from human.jsonl and builds the known-hack
rows from it, so a hack can be recorded after the review sample it came from was replaced.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from closedloop.io import BatchFileError, read_jsonl, write_jsonl
from closedloop.workspace import Workspace

INBOX = "data/labels/inbox.jsonl"
LABELS = ("correct", "wrong", "reward_hacking", "formatting", "other")
Label = Literal["correct", "wrong", "reward_hacking", "formatting", "other"]
# The fields of a review sample row an answer copies, so a label applies without the sample file.
_FROM_SAMPLE = ("sample_id", "task_id", "env", "completion_sha256", "model_version", "iteration")


class AnswerError(ValueError):
    """A submission was refused; the message names the field (and the sample id). Nothing was written."""


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sample_id: str = Field(min_length=1)
    score: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="0: wrong … 1: fully right")
    label: Label
    comment: str = ""


class Submission(BaseModel):
    """One reviewer's answers to some samples of one review sample."""

    model_config = ConfigDict(extra="forbid")

    reviewer: str = Field(min_length=1)
    answers: list[Answer] = Field(min_length=1)

    @field_validator("reviewer")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name the reviewer (not blank)")
        return value.strip()


def inbox_path(ws: Workspace) -> Path:
    return ws.path(INBOX)


def read_review_sample(ws: Workspace) -> list[dict[str, Any]]:
    """The review sample the grade stage wrote; empty when review is off or nothing was drawn."""
    return read_jsonl(ws.review_sample, required=_FROM_SAMPLE + ("prompt", "completion", "task", "verifier"))


def _field_name(loc: tuple, data: Any) -> str:
    """``answers[2].score (sample code/x#0)`` from a pydantic error location."""
    parts = []
    for item in loc:
        parts.append(f"[{item}]" if isinstance(item, int) else ("." if parts else "") + str(item))
    name = "".join(parts)
    if len(loc) >= 2 and loc[0] == "answers" and isinstance(loc[1], int) and isinstance(data, Mapping):
        try:
            name += f" (sample {data['answers'][loc[1]]['sample_id']})"
        except (KeyError, IndexError, TypeError):
            pass
    return name


def validate_submission(data: Mapping[str, Any] | Submission,
                        review: Mapping[str, Mapping[str, Any]]) -> Submission:
    """The whole submission checked before anything is written: types and ranges, every sample id one
    of ``review``'s (the review sample rows by id), no sample answered twice."""
    if isinstance(data, Submission):
        submission = data
    else:
        try:
            submission = Submission.model_validate(data)
        except ValidationError as error:
            problems = [f"{_field_name(e['loc'], data)}: {e['msg']}"
                        + (f" (got {e['input']!r})" if e["type"] not in ("missing", "extra_forbidden")
                           and not isinstance(e["input"], (dict, list)) else "")
                        for e in error.errors()]
            raise AnswerError("; ".join(problems)) from None
    seen: set[str] = set()
    for index, answer in enumerate(submission.answers):
        if answer.sample_id not in review:
            raise AnswerError(f"answers[{index}].sample_id: {answer.sample_id!r} is not in the review sample "
                              f"({len(review)} samples, e.g. {next(iter(review), 'none')!r})")
        if answer.sample_id in seen:
            raise AnswerError(f"answers[{index}].sample_id: {answer.sample_id!r} is answered twice")
        seen.add(answer.sample_id)
    return submission


def inbox_rows(submission: Submission, review: Mapping[str, Mapping[str, Any]], source: str,
               now: datetime | None = None) -> list[dict[str, Any]]:
    time = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds").replace("+00:00", "Z")
    rows = []
    for answer in submission.answers:
        sample = review[answer.sample_id]
        verdict = sample["verifier"]
        rows.append({
            **{key: sample[key] for key in _FROM_SAMPLE},
            "answer_id": uuid.uuid4().hex, "reviewer": submission.reviewer, "score": float(answer.score),
            "label": answer.label, "comment": answer.comment, "time": time,
            "verifier": {"passed": bool(verdict["passed"]), "reward": float(verdict["reward"]),
                         "status": verdict["status"]},
            "source": source,
            "sample": {"prompt": sample["prompt"], "completion": sample["completion"], "task": sample["task"]},
        })
    return rows


@contextmanager
def _locked_inbox(ws: Workspace) -> Iterator[Any]:
    """The inbox opened for reading and appending, under an exclusive flock. The lock is on the inbox
    itself, which is only ever appended to or truncated in place (never replaced), so every process
    locks the same inode."""
    path = inbox_path(ws)
    path.parent.mkdir(parents=True, exist_ok=True)
    ensure_ignored(ws)
    with path.open("a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_ignored(ws: Workspace) -> None:
    """Keep the inbox out of git: an entry in data/labels/.gitignore, the file `dvc add` also writes
    its own entries to (it appends; it never removes lines it did not write)."""
    gitignore = ws.path(INBOX).parent / ".gitignore"
    entry = "/" + Path(INBOX).name
    existing = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
    if entry not in existing.splitlines():
        gitignore.write_text(existing + ("\n" if existing and not existing.endswith("\n") else "") + entry + "\n",
                             encoding="utf-8")


def append_to_inbox(ws: Workspace, rows: Iterable[Mapping[str, Any]]) -> int:
    """Append rows in one write (so a reader never sees half a submission) and fsync before unlocking."""
    text = "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)
    if not text:
        return 0
    with _locked_inbox(ws) as handle:
        handle.seek(0)
        existing = handle.read()
        if existing and not existing.endswith("\n"):
            # A write a kill cut short: drop its partial line, or this one would be glued onto it and
            # leave a bad line in the middle of the inbox, which stops every later merge.
            handle.truncate(len(existing[: existing.rfind("\n") + 1].encode("utf-8")))
        os.write(handle.fileno(), text.encode("utf-8"))  # O_APPEND: one write, at the end
        os.fsync(handle.fileno())
    return text.count("\n")


def submit(ws: Workspace, data: Mapping[str, Any] | Submission, review: Iterable[Mapping[str, Any]],
           source: str) -> list[dict[str, Any]]:
    """Validate a submission against the review sample rows it answers, then queue it; returns the rows."""
    by_id = {row["sample_id"]: row for row in review}
    rows = inbox_rows(validate_submission(data, by_id), by_id, source)
    append_to_inbox(ws, rows)
    return rows


def _read_inbox(handle: Any, path: Path) -> tuple[list[dict[str, Any]], int]:
    """(rows, torn): a last line without its newline that does not parse is a write a kill cut short;
    it is dropped and counted. Any other bad line is an error naming it."""
    handle.seek(0)
    lines = handle.read().split("\n")
    rows, torn = [], 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # no newline after it: the append never finished
                torn += 1
                continue
            raise BatchFileError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict) or "answer_id" not in row:
            raise BatchFileError(f"{path}:{number}: expected an answer row with an answer_id")
        rows.append(row)
    return rows, torn


def queued_answers(ws: Workspace) -> list[dict[str, Any]]:
    """Every answer waiting in the inbox, in the order they came."""
    if not inbox_path(ws).exists():
        return []
    with _locked_inbox(ws) as handle:
        rows, _ = _read_inbox(handle, inbox_path(ws))
    return rows


def inbox_rows_for(ws: Workspace, iteration: int) -> list[dict[str, Any]]:
    """The queued answers about iteration ``iteration``'s batch, in the order they came."""
    return [row for row in queued_answers(ws) if row.get("iteration") == iteration]


def label_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The human.jsonl row of an inbox row: the shared contract, without the sample it was about."""
    return {key: value for key, value in row.items() if key != "sample"}


def known_hack_row(row: Mapping[str, Any]) -> dict[str, Any]:
    sample = row["sample"]
    return {"sample_id": row["sample_id"], "env": row["env"], "task": sample["task"],
            "completion": sample["completion"], "iteration": row["iteration"], "reviewer": row["reviewer"],
            "time": row["time"], "comment": row["comment"], "answer_id": row["answer_id"]}


def _existing(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path) if path.exists() else []


def merge_inbox(ws: Workspace) -> dict[str, Any]:
    """Move the inbox into human.jsonl (deduplicated by answer_id) and its reward_hacking answers into
    known_hacks.jsonl, then empty the inbox. Call it under the workspace lock, before `dvc add`.

    Crash-safe: both targets are written whole (atomic rename) before the inbox is truncated, so a
    merge killed anywhere and repeated adds nothing twice. Returns the counts and ``answers``: the
    newly merged inbox rows (with the sample they were about), e.g. for tracking.log_review_traces."""
    with _locked_inbox(ws) as handle:
        rows, torn = _read_inbox(handle, inbox_path(ws))
        labels = _existing(ws.human_labels)
        hacks = _existing(ws.known_hacks)
        have = {row.get("answer_id") for row in labels}
        fresh, seen = [], set(have)
        for row in rows:
            if row["answer_id"] not in seen:
                seen.add(row["answer_id"])
                fresh.append(row)
        hacked = {row.get("answer_id") for row in hacks}
        new_hacks = [known_hack_row(row) for row in rows
                     if row.get("label") == "reward_hacking" and row["answer_id"] not in hacked]
        new_hacks = list({row["answer_id"]: row for row in new_hacks}.values())
        if fresh:
            write_jsonl(ws.human_labels, [*labels, *(label_row(row) for row in fresh)])
        if new_hacks:
            write_jsonl(ws.known_hacks, [*hacks, *new_hacks])
        handle.truncate(0)
        handle.flush()
        os.fsync(handle.fileno())
    return {"merged": len(fresh), "duplicates": len(rows) - len(fresh), "known_hacks": len(new_hacks),
            "torn": torn, "labels": len(labels) + len(fresh), "answers": fresh}
