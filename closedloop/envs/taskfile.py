"""Task sets in JSONL files: one closedloop task per line (the format `closedloop tasks export` writes).

A file is checked whole before any task is used, so a malformed line stops the stage before it
writes anything; each problem names the file, the line and the field (and the task, once the line
is one), and every problem of the file is reported at once (up to MAX_REPORTED). The code
environment also takes HumanEval-format files (see humaneval.py), told apart by their fields.

A task's hidden checks are checked against what its environment declares (base.Environment):
``task_checks``, a TypedDict of the fields its verifier reads, and ``check_task(task)`` for what a
type cannot say. An environment that declares neither (a user's, say) has its checks taken as they are.
"""

from __future__ import annotations

import json
import random
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Union

from closedloop.envs import ENVIRONMENTS, environment_class
from closedloop.envs.base import SLICES, SPLITS, Task
from closedloop.envs.humaneval import TaskFileError, json_records, load_humaneval
from closedloop.sandbox.records import Job

MAX_REPORTED = 20  # problems one error message lists; the rest are counted
TaskCheck = Callable[[Task], list[str]]

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


def load_task_file(path: Path | str, env: str | None = None, check: TaskCheck | None = None) -> list[Task]:
    """Every task of a closedloop JSONL task file (gzip or not), ids unique.

    ``check(task)``, when given (task_check_of an environment, or checks_by_env for a file that mixes
    them), lists what is wrong with a task for its environment. Every problem of the file is
    collected, then raised as one TaskFileError, one "file:line: task 'id': problem" per line.
    """
    path = Path(path)
    tasks: list[Task] = []
    problems: list[str] = []
    first_line: dict[str, int] = {}
    for number, where, record in json_records(path, str(list(FIELD_TYPES))):
        try:
            task = task_from_record(record, where, env)
        except TaskFileError as error:
            problems.append(str(error))
            continue
        found = check(task) if check is not None else []
        if task.task_id in first_line:
            found = [f"field 'task_id' repeats line {first_line[task.task_id]}", *found]
        problems += [f"{where}: task {task.task_id!r}: {problem}" for problem in found]
        first_line.setdefault(task.task_id, number)
        tasks.append(task)
    if problems:
        raise TaskFileError(_report(path, problems))
    if not tasks:
        raise TaskFileError(f"{path}: no tasks in the file")
    return tasks


def _report(path: Path, problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    shown = problems[:MAX_REPORTED]
    more = [f"... and {len(problems) - len(shown)} more"] if len(problems) > len(shown) else []
    return "\n  ".join([f"{path}: {len(problems)} problems in the task file:", *shown, *more])


def load_any(path: Path | str, env: str, env_class: type | None = None) -> list[Task]:
    """A closedloop task file, or (for the code environment) a HumanEval-format one; its tasks are
    checked against ``env_class`` (default: the built-in environment ``env``, if there is one)."""
    path = Path(path)
    if env == "code" and is_humaneval_file(path):
        return load_humaneval(path)
    cls = env_class if env_class is not None else _class_of(env, None)
    return load_task_file(path, env, task_check_of(cls) if cls is not None else None)


def checks_by_env(params: Any = None) -> TaskCheck:
    """The check of a file that mixes environments: each task against its own environment's
    declarations (built-in ones, and params.yaml's envs.custom when ``params`` is given). A task of
    an environment nobody knows is not checked here; whoever verifies it says it is unknown."""
    found: dict[str, TaskCheck | None] = {}

    def check(task: Task) -> list[str]:
        if task.env not in found:
            cls = _class_of(task.env, params)
            found[task.env] = task_check_of(cls) if cls is not None else None
        task_check = found[task.env]
        return task_check(task) if task_check is not None else []

    return check


def task_check_of(env_class: Any) -> TaskCheck | None:
    """What an environment (class) declares about its tasks' checks, as one check; None if nothing.

    The declared ``task_checks`` come first; ``check_task`` runs only on checks that have those
    shapes, so it may index them freely.
    """
    declared = getattr(env_class, "task_checks", None)
    own = getattr(env_class, "check_task", None)
    if declared is None and own is None:
        return None

    def check(task: Task) -> list[str]:
        problems = shape_problems(task.checks, declared, "checks") if declared is not None else []
        return problems or (list(own(task)) if own is not None else [])

    return check


def _class_of(env_name: str, params: Any) -> type | None:
    custom = params.envs.custom if params is not None else {}
    if env_name not in ENVIRONMENTS and env_name not in custom:
        return None
    return environment_class(env_name, params)


# -- shapes of hidden checks ----------------------------------------------------------------------
# A shape is a type annotation over JSON values: str, int (never a bool), float (an int too), bool,
# None, Any, list / list[X], dict / dict[str, X], Literal[...], a Union, or a TypedDict (an object
# holding at least its required keys; other keys are the environment's own business).


def shape_problems(value: Any, shape: Any, where: str) -> list[str]:
    """Every place where ``value`` (parsed JSON) lacks ``shape``, e.g. 'checks.start["a.txt"] must be a
    string, got int' or "checks is missing 'expected'"; [] when it has it."""
    if shape is Any:
        return []
    origin, args = typing.get_origin(shape), typing.get_args(shape)
    if origin in (Union, types.UnionType):
        if any(not shape_problems(value, option, where) for option in args):
            return []
        return [f"{where} must be {describe(shape)}, got {_json_type(value)}"]
    if origin is Literal:
        return [] if value in args and type(value) in {type(a) for a in args} else [
            f"{where} must be {describe(shape)}, got {json.dumps(value, ensure_ascii=False)[:60]}"]
    if not _has_type(value, shape):
        return [f"{where} must be {describe(shape)}, got {_json_type(value)}"]
    if typing.is_typeddict(shape):
        hints = typing.get_type_hints(shape)
        problems = [f"{where} is missing {key!r}" for key in hints if key in shape.__required_keys__ and key not in value]
        for key, inner in hints.items():
            if key in value:
                problems += shape_problems(value[key], inner, f"{where}.{key}")
        return problems
    if origin is list and args:
        return [problem for i, item in enumerate(value) for problem in shape_problems(item, args[0], f"{where}[{i}]")]
    if origin is dict and args:
        return [problem for key, item in value.items()
                for problem in shape_problems(item, args[1], f"{where}[{json.dumps(key, ensure_ascii=False)}]")]
    return []


def _has_type(value: Any, shape: Any) -> bool:
    """Whether ``value`` is of the JSON type of ``shape`` (its container, for list[X] and the like)."""
    base = dict if typing.is_typeddict(shape) else typing.get_origin(shape) or shape
    if base is None or base is type(None):
        return value is None
    if base is float:
        return type(value) in (int, float)
    return type(value) is base


_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list", dict: "an object"}


def describe(shape: Any) -> str:
    """What a value of ``shape`` is, in the words of an error message."""
    origin, args = typing.get_origin(shape), typing.get_args(shape)
    if origin in (Union, types.UnionType):
        words = [describe(option) for option in args]
        return ", ".join(words[:-1]) + " or " + words[-1]
    if origin is Literal:
        return f"one of {list(args)}"
    if shape is None or shape is type(None):
        return "null"
    if typing.is_typeddict(shape):
        return "an object"
    return _NAMES.get(origin or shape, str(shape))


def _json_type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def file_tree_problems(files: dict[str, str], where: str) -> list[str]:
    """The paths of ``files`` a sandbox job would not place in its directory (records.Job's rule)."""
    problems = []
    for path in files:
        try:
            Job("", "", files={path: ""})
        except ValueError:
            problems.append(f"{where}[{json.dumps(path, ensure_ascii=False)}] must be a relative path inside the job directory")
    return problems


def tasks_for(env: Any, section: Any, n: int, seed: int, split: str, slice: str = "core") -> list[Task]:
    """``n`` tasks of ``split``: from the section's train_file / benchmark_file when set, else generated.

    A benchmark file is taken whole, each task keeping its own slice (``slice`` selects among them);
    a training file gives ``n`` tasks (cycling) in a seeded order.
    """
    task_file = section.benchmark_file if split == "benchmark" else section.train_file
    if not task_file:
        return env.generate(n, seed, split, slice)
    tasks = load_any(task_file, env.name, type(env))
    if split == "benchmark":
        return [t if t.split == "benchmark" else _as_benchmark(t) for t in tasks if t.slice == slice]
    tasks = [Task.from_record({**t.to_record(), "split": "train"}) for t in tasks]
    random.Random(f"{env.name}/file/{seed}").shuffle(tasks)
    return [tasks[i % len(tasks)] for i in range(n)]


def _as_benchmark(task: Task) -> Task:
    return Task.from_record({**task.to_record(), "split": "benchmark"})
