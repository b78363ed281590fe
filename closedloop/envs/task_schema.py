"""The task file reference, generated from the environments: for each built-in one, the fields of a
task line, the ``checks`` fields its verifier reads (its ``task_checks`` TypedDict, each field's meaning
from the trailing comment on it), what its ``check_task`` refuses besides, and one real task line.

    .venv/bin/python -m closedloop.envs.task_schema > docs/task-files.md

tests/unit/test_task_schema.py holds the committed file equal to :func:`render_task_schemas`.
A tool, not code any stage runs: no stage imports it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import sys
import tempfile
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from closedloop.config import Params
from closedloop.envs import (
    ENVIRONMENTS,
    environment_class,
    get_env,
    humaneval,
    taskfile,
)
from closedloop.envs.base import Task
from closedloop.io import write_jsonl

OUTPUT = "docs/task-files.md"
COMMAND = f".venv/bin/python -m closedloop.envs.task_schema > {OUTPUT}"
EXAMPLE = {"n": 1, "seed": 0, "split": "train"}  # the arguments of generate() the example line comes from
MAX_TEXT = 400  # characters of an example's prompt or reference kept (the checks are kept whole)
MAX_CELL = 40  # characters of a value shown in a table cell
_WORDS = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "object"}

HEADER = f"""Generated from `closedloop/envs/`; do not edit by hand, regenerate it: `{COMMAND}`

# Task files

A task file is JSONL: one task per line, as `closedloop tasks export` writes it, read from
`envs.<env>.train_file` and `envs.<env>.benchmark_file` (see [environments.md](environments.md)).
Each built-in environment's section below gives the fields of a line, the `checks` fields its
verifier reads (read from its `task_checks` declaration; other keys of `checks` are allowed and not
read), what it refuses besides, and one line it generated (`generate({", ".join(f"{k}={v!r}" for k, v in EXAMPLE.items())})`).
"""


def render_task_schemas() -> str:
    """The Markdown page: a lead from taskfile.py, then one section per built-in environment."""
    lead = taskfile.__doc__.split("\n\n", 1)[1].replace("MAX_REPORTED", str(taskfile.MAX_REPORTED))
    parts = [HEADER, _markdown(lead) + "\n"]
    params = Params()
    for name in ENVIRONMENTS:
        parts.append(env_section(name, params))
    return "\n".join(parts)


def env_section(name: str, params: Params) -> str:
    cls = environment_class(name)
    example = example_record(name, params)
    lines = [f"## `{name}`", "", f"`{cls.__module__}.{cls.__qualname__}`", "", "### Fields of a line", ""]
    lines += top_level_table(name, example)
    lines += ["", "### `checks`", ""]
    shapes = checks_shapes(cls)
    if len(shapes) > 1:
        lines += [f"`checks` has one of {len(shapes)} shapes (`{cls.__qualname__}.check_task` tells them apart).", ""]
    for shape in shapes:
        if len(shapes) > 1:
            lines += [f"#### `{shape.__name__}`", ""]
        lines += checks_table(shape) + [""]
    lines = lines[:-1] + refusals(cls)
    if name == "code":  # taskfile.load_any reads HumanEval's format for this environment only
        fields = ", ".join(f"`{field}`" for field in humaneval.FIELDS)
        lines += ["", f"A file for this environment may instead be in HumanEval's format ({fields} per line)."]
    lines += ["", "### Example line", "", "```json", example_line(example), "```", ""]
    return "\n".join(lines)


# -- the fields of a line -------------------------------------------------------------------------


def top_level_table(name: str, example: dict[str, Any]) -> list[str]:
    """The fields taskfile.task_from_record requires (FIELD_TYPES), their meaning from Task's source."""
    meanings = task_field_meanings()
    rows = ["| Field | Must be | Required | Meaning | In the example |", "| --- | --- | --- | --- | --- |"]
    for field, (_, expected) in taskfile.FIELD_TYPES.items():
        shown = "see `checks` below" if field == "checks" else f"`{_short_json(example[field])}`"
        rows.append(f"| `{field}` | {_cell(expected)} | yes | {_cell(meanings.get(field, ''))} | {_cell(shown)} |")
    lead = _markdown(inspect.getdoc(Task).split("\n\n")[0])
    return [lead, "", *rows, "",
            (f"No other field is allowed, `task_id` is unique in the file, and `env` is `{json.dumps(name)}` "
             "(the environment the file is read as).")]


@functools.cache
def task_field_meanings() -> dict[str, str]:
    """Each Task field's meaning: the trailing comment on it, else the clause of Task's docstring
    that starts with its name (``prompt`` is all the policy sees; ...)."""
    meanings = field_comments(Task)
    doc = " ".join(inspect.getdoc(Task).split())
    for field in (f.name for f in dataclasses.fields(Task)):
        start = doc.find(f"``{field}`` ")
        if field in meanings or start < 0:
            continue
        clause, depth = "", 0
        for char in doc[start:]:
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0 and char in ";." and clause:
                break
            clause += char
        meanings[field] = _markdown(clause)
    return meanings


# -- the checks -----------------------------------------------------------------------------------


def checks_shapes(cls: type) -> list[type]:
    """The TypedDicts of an environment's checks: its ``task_checks``, else those its ``check_task``
    names (the code environment's: calls with expected values, or a HumanEval test), in source order."""
    declared = getattr(cls, "task_checks", None)
    if declared is not None:
        return [declared]
    check = getattr(cls, "check_task", None)
    if check is None:
        return []
    tree = ast.parse(textwrap.dedent(inspect.getsource(check)))
    named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    found = [check.__globals__[n] for n in named if typing.is_typeddict(check.__globals__.get(n))]
    return sorted(found, key=lambda shape: _definition(shape)[0].lineno)


def checks_table(shape: type) -> list[str]:
    used: set[str] = set()
    lead = typeddict_lead(shape, used)
    rows = ["| Field | Type | Required | Meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{path}` | {_cell(kind)} | {required} | {_cell(meaning)} |"
             for path, kind, required, meaning in checks_rows(shape, "checks", used)]
    return ([lead, ""] if lead else []) + rows


def checks_rows(shape: type, prefix: str, used: set[str]) -> list[tuple[str, str, str, str]]:
    """(dotted path, type, required, meaning) of every field of ``shape``, nested TypedDicts expanded
    under their field (``checks.spec.rules[].id``: the ``id`` of each item of the list)."""
    comments = field_comments(shape)
    rows = []
    for key, hint in typing.get_type_hints(shape).items():
        path = f"{prefix}.{key}"
        nested, suffix = _nested(hint)
        meaning = comments.get(key, "")
        if not meaning and nested is not None:
            meaning = typeddict_lead(nested, used)
        rows.append((path, type_text(hint), "yes" if key in shape.__required_keys__ else "no", meaning))
        if nested is not None:
            rows += checks_rows(nested, path + suffix, used)
    return rows


def typeddict_lead(shape: type, used: set[str]) -> str:
    """The lead of a TypedDict (see _lead_text) in Markdown; '' when it was used already in this table."""
    text = _markdown(_lead_text(shape))
    if text in used:
        return ""
    used.add(text)
    return text


def _lead_text(shape: type) -> str:
    """A TypedDict's docstring, else the comment block above its definition, else that of the first
    TypedDict it nests that has one; '' when none has."""
    node, comments = _definition(shape)
    text = ast.get_docstring(node) if isinstance(node, ast.ClassDef) else None
    if text:
        return text
    above = []
    for line in range(node.lineno - 1, 0, -1):
        if line not in comments or not comments[line][1]:
            break
        above.insert(0, comments[line][0])
    if above:
        return " ".join(above)
    for hint in typing.get_type_hints(shape).values():
        nested, _ = _nested(hint)
        if nested is not None and (text := _lead_text(nested)):
            return text
    return ""


def type_text(hint: Any) -> str:
    """A type as JSON calls its values: ``list of string``, ``"exact" or "any"``, ``object (Table)``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return "any"
    if hint is None or hint is type(None):
        return "null"
    if typing.is_typeddict(hint):
        return f"object ({hint.__name__})"
    if origin is Literal:
        return " or ".join(json.dumps(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(arg) for arg in args)
    if origin is list and args:
        return f"list of {_grouped(args[0])}"
    if origin is dict and args:
        return "object" if args[1] is Any else f"object ({type_text(args[0])} → {type_text(args[1])})"
    return _WORDS.get(origin or hint, str(hint))


def _grouped(hint: Any) -> str:
    """An item type, in parentheses when it is a choice (``list of (string or null)``)."""
    text = type_text(hint)
    return f"({text})" if typing.get_origin(hint) in (Literal, Union, types.UnionType) else text


def _nested(hint: Any) -> tuple[type | None, str]:
    """The TypedDict a field holds (itself, or the items of its list or object) and the path suffix."""
    if typing.is_typeddict(hint):
        return hint, ""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args and typing.is_typeddict(args[0]):
        return args[0], "[]"
    if origin is dict and len(args) == 2 and typing.is_typeddict(args[1]):
        return args[1], "[*]"
    return None, ""


def refusals(cls: type) -> list[str]:
    """What ``check_task`` refuses besides the shapes: its docstring, else its code."""
    check = getattr(cls, "check_task", None)
    if check is None:
        return []
    lines = ["", "### Also refused", "", f"`{cls.__qualname__}.check_task`, run on checks of the shapes above:", ""]
    doc = inspect.getdoc(check)
    if doc:
        return lines + [_markdown(doc)]
    body = ast.parse(textwrap.dedent(inspect.getsource(check))).body[0].body
    code = "\n".join(ast.unparse(statement) for statement in body)
    return lines + ["(it has no docstring; its code:)", "", "```python", code, "```"]


# -- reading the source ---------------------------------------------------------------------------


def field_comments(owner: type) -> dict[str, str]:
    """{field: the trailing ``# comment`` on its line} of a class or a functional TypedDict; a class's
    TypedDict bases (in its module) give theirs first (code.CallsChecks' optional field is its own)."""
    node, comments = _definition(owner)
    lines: dict[str, int] = {}
    inherited: dict[str, str] = {}
    if isinstance(node, ast.ClassDef):
        lines = {stmt.target.id: stmt.end_lineno for stmt in node.body
                 if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
        for base in node.bases:
            found = vars(sys.modules[owner.__module__]).get(base.id) if isinstance(base, ast.Name) else None
            if found is not None and typing.is_typeddict(found):
                inherited.update(field_comments(found))
    elif isinstance(node.value, ast.Call) and len(node.value.args) > 1 and isinstance(node.value.args[1], ast.Dict):
        fields = node.value.args[1]
        lines = {key.value: value.end_lineno for key, value in zip(fields.keys, fields.values)
                 if isinstance(key, ast.Constant)}
    return {**inherited, **{field: comments[line][0] for field, line in lines.items()
                            if line in comments and not comments[line][1]}}


def _definition(owner: type) -> tuple[ast.ClassDef | ast.Assign, dict[int, tuple[str, bool]]]:
    """The top-level statement defining ``owner`` in its module, and the module's comments by line."""
    tree, comments = _module_source(owner.__module__)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == owner.__name__:
            return node, comments
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == owner.__name__
                                                 for t in node.targets):
            return node, comments
    raise LookupError(f"{owner.__module__} does not define {owner.__name__} at module level")


@functools.cache
def _module_source(module: str) -> tuple[ast.Module, dict[int, tuple[str, bool]]]:
    """A module's syntax tree, and {line: (comment text, whether the comment is the whole line)}."""
    source = inspect.getsource(sys.modules[module])
    lines = source.splitlines()
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            whole = not lines[row - 1][:column].strip()
            comments[row] = (token.string.lstrip("#").strip(), whole)
    return ast.parse(source), comments


# -- the example line -----------------------------------------------------------------------------


def example_record(name: str, params: Params) -> dict[str, Any]:
    """A task the environment generated, its prompt and reference cut at MAX_TEXT characters."""
    (task,) = get_env(name, params).generate(EXAMPLE["n"], EXAMPLE["seed"], EXAMPLE["split"])
    record = task.to_record()
    for field in ("prompt", "reference"):
        text = record[field]
        if len(text) > MAX_TEXT:
            record[field] = text[:MAX_TEXT] + f"… [{len(text) - MAX_TEXT} more characters]"
    return record


def example_line(record: dict[str, Any]) -> str:
    """The record as a task file holds it: written by write_jsonl, as `closedloop tasks export` does."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tasks.jsonl"
        write_jsonl(path, [record])
        return path.read_text(encoding="utf-8").rstrip("\n")


def _short_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _markdown(text: str) -> str:
    """Docstring text on one line, reST literals as Markdown code."""
    return " ".join(text.replace("``", "`").split())


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


if __name__ == "__main__":
    sys.stdout.write(render_task_schemas())
