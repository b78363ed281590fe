"""Task sets in JSONL files: one closedloop task per line (the format `closedloop tasks export` writes).

A file is checked whole before any task is used, so a malformed line stops the stage before it
writes anything; the message names the file, the line and the field. The code environment also
takes HumanEval-format files (see humaneval.py), told apart by their fields.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from closedloop.envs.base import SLICES, SPLITS, Task
from closedloop.envs.humaneval import TaskFileError, json_records, load_humaneval

# field -> (type, what the message says it must be)
FIELD_TYPES: dict[str, tuple[type, str]] = {
    "task_id": (str, "a non-empty string"),
    "env": (str, "a string naming the environment"),
    "split": (str, f"one of {list(SPLITS)}"),
    "slice": (str, f"one of {list(SLICES)}"),
    "kind": (str, "a string"),
    "prompt": (str, "a non-empty string"),
    "entry_point": (str, "a string"),
    "checks": (dict, "an object holding the hidden checks"),
    "reference": (str, "a string"),
}


def is_humaneval_file(path: Path) -> bool:
    """True when the first record has HumanEval's fields rather than closedloop's."""
    for _, _, record in json_records(path, "of a task"):
        return "canonical_solution" in record and "checks" not in record
    return False


def task_from_record(record: dict[str, Any], where: str, env: str | None = None) -> Task:
    """A Task from one JSON object, or TaskFileError naming ``where`` and the first bad field."""
    for name, (kind, expected) in FIELD_TYPES.items():
        if name not in record:
            raise TaskFileError(f"{where}: missing field {name!r} ({expected})")
        value = record[name]
        if type(value) is not kind or (name in ("task_id", "prompt") and not value):
            raise TaskFileError(f"{where}: field {name!r} must be {expected}, got {value!r:.60}")
    extra = sorted(set(record) - set(FIELD_TYPES))
    if extra:
        raise TaskFileError(f"{where}: unknown field(s) {extra}; a task has {list(FIELD_TYPES)}")
    if record["split"] not in SPLITS:
        raise TaskFileError(f"{where}: field 'split' must be one of {list(SPLITS)}, got {record['split']!r}")
    if record["slice"] not in SLICES:
        raise TaskFileError(f"{where}: field 'slice' must be one of {list(SLICES)}, got {record['slice']!r}")
    if env is not None and record["env"] != env:
        raise TaskFileError(f"{where}: field 'env' is {record['env']!r}, but this file is read as {env!r} tasks")
    return Task.from_record(record)


def load_task_file(path: Path | str, env: str | None = None, check: Any = None) -> list[Task]:
    """Every task of a closedloop JSONL task file (gzip or not), ids unique.

    ``check(task)``, when given (an environment's ``check_task``), returns what is wrong with a task's
    checks for that environment, or None; the message then names the line.
    """
    path = Path(path)
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for number, where, record in json_records(path, str(list(FIELD_TYPES))):
        task = task_from_record(record, where, env)
        problem = check(task) if check is not None else None
        if problem:
            raise TaskFileError(f"{where}: {problem}")
        if task.task_id in first_line:
            raise TaskFileError(f"{where}: field 'task_id' {task.task_id!r} repeats line {first_line[task.task_id]}")
        first_line[task.task_id] = number
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{path}: no tasks in the file")
    return tasks


def load_any(path: Path | str, env: str) -> list[Task]:
    """A closedloop task file, or (for the code environment) a HumanEval-format one."""
    path = Path(path)
    if env == "code" and is_humaneval_file(path):
        return load_humaneval(path)
    return load_task_file(path, env, _check_of(env))


def check_for_env(task: Task) -> str | None:
    """A task's own environment's ``check_task`` (for files that mix environments)."""
    check = _check_of(task.env)
    return check(task) if check is not None else None


def _check_of(env_name: str) -> Any:
    """The built-in environment's ``check_task``, if it has one (a user's file is checked up front)."""
    from closedloop.envs import ENVIRONMENTS, environment_class

    if env_name not in ENVIRONMENTS:
        return None
    return getattr(environment_class(env_name), "check_task", None)


def tasks_for(env: Any, section: Any, n: int, seed: int, split: str, slice: str = "core") -> list[Task]:
    """``n`` tasks of ``split``: from the section's train_file / benchmark_file when set, else generated.

    A benchmark file is taken whole, each task keeping its own slice (``slice`` selects among them);
    a training file gives ``n`` tasks (cycling) in a seeded order.
    """
    task_file = section.benchmark_file if split == "benchmark" else section.train_file
    if not task_file:
        return env.generate(n, seed, split, slice)
    tasks = load_any(task_file, env.name)
    if split == "benchmark":
        return [t if t.split == "benchmark" else _as_benchmark(t) for t in tasks if t.slice == slice]
    tasks = [Task.from_record({**t.to_record(), "split": "train"}) for t in tasks]
    random.Random(f"{env.name}/file/{seed}").shuffle(tasks)
    return [tasks[i % len(tasks)] for i in range(n)]


def _as_benchmark(task: Task) -> Task:
    return Task.from_record({**task.to_record(), "split": "benchmark"})
