"""HumanEval-format task sets: ``task_id, prompt, canonical_solution, test, entry_point`` per JSONL line.

Such a set (gzip or not) can be the code environment's training source or its benchmark, and
``closedloop verify`` scores other models' completions on it. The program a completion makes is
``prompt + completion`` (for a chat reply, what envs/extraction.py reads from it); it runs in the
sandbox, and the test's ``check(candidate)`` runs on the trusted side after the prompt (which defines
helpers the tests use), never in the same process.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from closedloop.envs.base import Task
from closedloop.sandbox.records import Job

FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


class TaskFileError(ValueError):
    """A malformed task file; the message names the file, the line and the field."""


def read_lines(path: Path) -> list[str]:
    """The lines of a JSONL file, gunzipped when it is gzip (by content, not by name)."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TaskFileError(f"{path}: cannot read the task file ({error.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as error:
            raise TaskFileError(f"{path}: not a valid gzip file ({error})") from None
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise TaskFileError(f"{path}: not UTF-8 text ({error})") from None


def json_records(path: Path, fields: str):
    """(line number, "path:line", record) for each non-blank line, every record a JSON object."""
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as error:
            raise TaskFileError(f"{where}: not valid JSON ({error})") from None
        if type(record) is not dict:
            raise TaskFileError(f"{where}: expected a JSON object with fields {fields}")
        yield number, where, record


def load_humaneval(path: Path, split: str = "benchmark") -> list[Task]:
    """Every problem of a HumanEval-format file as a Task; the whole file is checked before any is used."""
    tasks, seen = [], {}
    for number, where, record in json_records(path, str(list(FIELDS))):
        for name in FIELDS:
            if name not in record:
                raise TaskFileError(f"{where}: missing field {name!r} (a HumanEval record has {list(FIELDS)})")
            if type(record[name]) is not str or (name != "canonical_solution" and not record[name].strip()):
                raise TaskFileError(f"{where}: field {name!r} must be a non-empty string")
        if "def check(" not in record["test"]:
            raise TaskFileError(f"{where}: field 'test' must define check(candidate)")
        task_id = record["task_id"]
        if task_id in seen:
            raise TaskFileError(f"{where}: duplicate task_id {task_id!r} (first on line {seen[task_id]})")
        seen[task_id] = number
        tasks.append(Task(task_id=task_id, env="code", split=split, slice="core", kind="humaneval",
                          prompt=record["prompt"], entry_point=record["entry_point"],
                          checks={"test": record["test"]}, reference=record["canonical_solution"]))
    if not tasks:
        raise TaskFileError(f"{path}: no tasks in the file")
    return tasks


def job_for(task: Task, completion: str) -> Job:
    """The sandbox job of a completion (a raw continuation) for a HumanEval-format task."""
    return program_job(task, task.prompt + completion)


def program_job(task: Task, program: str) -> Job:
    """The sandbox job of a whole program for a HumanEval-format task (the test's prelude stays the prompt)."""
    return Job(program, task.entry_point, test=task.checks["test"], prelude=task.prompt)
