"""docs/task-files.md is the rendering of the environments' task_checks, so it cannot drift from them;
its example lines are read as task files are, and a line missing a checks field is refused by name."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from closedloop.config import Params
from closedloop.envs import ENVIRONMENTS, environment_class, get_env
from closedloop.envs.code import CallsChecks, HumanEvalChecks
from closedloop.envs.humaneval import TaskFileError
from closedloop.envs.task_schema import COMMAND, OUTPUT, render_task_schemas
from closedloop.envs.taskfile import load_any

ROOT = Path(__file__).resolve().parents[2]
# The code environment declares no task_checks: its check_task picks one of two shapes.
SHAPES = {name: (CallsChecks, HumanEvalChecks) if name == "code" else (environment_class(name).task_checks,)
          for name in ENVIRONMENTS}


@pytest.fixture(scope="module")
def page() -> str:
    return render_task_schemas()


def section(page: str, name: str) -> str:
    found = re.search(rf"^## `{name}`\n(.*?)(?=^## |\Z)", page, re.DOTALL | re.MULTILINE)
    assert found, f"no section for {name}"
    return found.group(1)


def example_line(page: str, name: str) -> str:
    block = re.search(r"### Example line\n\n```json\n(.*?)\n```", section(page, name), re.DOTALL)
    assert block, f"no example line for {name}"
    assert "\n" not in block.group(1)
    return block.group(1)


def field_paths(shape: type, prefix: str = "checks") -> list[str]:
    """Every field of a TypedDict as the page names it, nested ones included (checks.spec.rules[].id)."""
    paths = []
    for key, hint in typing.get_type_hints(shape).items():
        path = f"{prefix}.{key}"
        paths.append(path)
        args = typing.get_args(hint)
        if typing.is_typeddict(hint):
            paths += field_paths(hint, path)
        elif typing.get_origin(hint) is list and args and typing.is_typeddict(args[0]):
            paths += field_paths(args[0], path + "[]")
    return paths


def write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_committed_page_is_the_rendering(page):
    committed = (ROOT / OUTPUT).read_text(encoding="utf-8")
    assert committed == page, f"{OUTPUT} differs from closedloop/envs/; regenerate it from the repository root: {COMMAND}"
    assert COMMAND in committed.splitlines()[0]


def test_sections_follow_the_registry(page):
    assert re.findall(r"^## `(\w+)`$", page, re.MULTILINE) == list(ENVIRONMENTS)


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_every_checks_field_is_in_the_section(page, name):
    text = section(page, name)
    missing = [path for shape in SHAPES[name] for path in field_paths(shape) if f"| `{path}` |" not in text]
    assert not missing, f"{name}: fields of its checks missing from the page: {missing}"
    assert "| `task_id` |" in text and "| `reference` |" in text


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_the_example_line_is_read_as_a_task_file_is(page, name, tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(example_line(page, name) + "\n", encoding="utf-8")
    (task,) = load_any(path, name)  # what tasks_for reads a train_file / benchmark_file with
    (generated,) = get_env(name, Params()).generate(1, 0, "train")
    assert task.checks == generated.checks and task.task_id == generated.task_id


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_a_line_missing_a_required_checks_field_is_refused_by_file_line_and_field(page, name, tmp_path):
    good = json.loads(example_line(page, name))
    required = [key for shape in SHAPES[name] for key in shape.__required_keys__ if key in good["checks"]]
    assert required
    for key in required:
        broken = {**good, "task_id": good["task_id"] + "-b", "checks": {k: v for k, v in good["checks"].items() if k != key}}
        path = write_lines(tmp_path / f"without-{key}.jsonl", [good, broken])
        with pytest.raises(TaskFileError) as refused:
            load_any(path, name)
        message = str(refused.value)
        assert message.startswith(f"{path}:2: ") and f"checks is missing {key!r}" in message, message


def test_what_the_page_says_of_every_line_holds(page, tmp_path):
    good = json.loads(example_line(page, "extract"))
    cases = {"unknown field(s) ['extra']": [{**good, "extra": 1}],
             "field 'task_id' repeats line 1": [good, good],
             "field 'env' is 'extract', but this file is read as 'rules' tasks": [good]}
    for number, (problem, records) in enumerate(cases.items()):
        path = write_lines(tmp_path / f"{number}.jsonl", records)
        with pytest.raises(TaskFileError, match=re.escape(problem)):
            load_any(path, "rules" if "rules" in problem else "extract")
    assert "No other field is allowed, `task_id` is unique in the file" in section(page, "extract")
