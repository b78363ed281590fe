"""The configuration reference, generated from the models: every key of params.yaml with its type,
default and description, one table per section, read from :class:`Params` down.

    .venv/bin/python -m closedloop.config.reference > docs/configuration-reference.md

tests/unit/test_config_reference.py holds the committed file equal to :func:`render_reference`.
Not imported by the package's ``__init__``: it is a tool, not code any stage runs.
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from closedloop.config.params import Params

OUTPUT = "docs/configuration-reference.md"
COMMAND = f".venv/bin/python -m closedloop.config.reference > {OUTPUT}"
PLACEHOLDER = "<name>"  # the key of an entry of a mapping of sections (envs.custom.<name>)
BOUNDS = ((Gt, "gt", ">"), (Ge, "ge", "≥"), (Lt, "lt", "<"), (Le, "le", "≤"))

HEADER = f"""# Configuration reference

Every key of `params.yaml`: its type, its default and what it sets, one table per section. What the
keys are for and how they work together is in [configuration.md](configuration.md).

Generated from the models in `closedloop/config/`; do not edit it by hand, regenerate it:

```
{COMMAND}
```
"""


@dataclass
class Table:
    """One section (or one variant of a section) and its keys: (key, type, default, description)."""

    path: str
    title: str
    doc: str
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


def render_reference() -> str:
    """The Markdown reference of every params.yaml key, from :class:`Params` down."""
    parts = [HEADER]
    for table in section_tables(Params, Params(), ""):
        parts.append(_render_table(table))
    return "\n".join(parts)


def section_tables(model: type[BaseModel], instance: BaseModel | None, path: str, title: str = "") -> list[Table]:
    """The table of ``model`` (at dotted ``path``) followed by those of its subsections, depth first.

    Defaults are read from ``instance`` where there is one (so envs.data.sandbox.memory_mb shows the
    data environment's 2048, not the field's 512), else from the fields (entries of a mapping)."""
    table = Table(path, title or f"`{path}`", _doc(model))
    below: list[Table] = []
    for name, info in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        value = getattr(instance, name) if instance is not None else _field_default(info)
        annotation = _unwrap(info.annotation)
        if _is_section(annotation):
            below += section_tables(annotation, value, key)
            continue
        variants = _variants(annotation)
        entry = _mapped_section(annotation)
        kind = _type_text(info, variants, entry)
        table.rows.append((key, kind, _default_text(value), _description(info, key, entry)))
        for variant in variants:
            chosen = value if isinstance(value, variant) else None
            below += section_tables(variant, chosen, key, f"`{key}` with `name: {_variant_name(variant)}`")
        if entry is not None:
            below += section_tables(entry, None, f"{key}.{PLACEHOLDER}")
    return ([table] if table.rows else []) + below


def _render_table(table: Table) -> str:
    level = "##" if "." not in table.path else "###"
    lines = [f"{level} {table.title}", ""]
    if table.doc:
        lines += [table.doc, ""]
    lines += ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for key, kind, default, description in table.rows:
        lines.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(description)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


def _doc(model: type[BaseModel]) -> str:
    """The model's own docstring on one line, in Markdown ('' when it has none of its own)."""
    doc = model.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(doc).replace("``", "`").split()) if doc else ""


def _field_default(info: FieldInfo) -> Any:
    if info.is_required():
        return _REQUIRED
    return info.get_default(call_default_factory=True)


class _Required:
    """The default of a key that has none: it must be given."""


_REQUIRED = _Required()


def _default_text(value: Any) -> str:
    if value is _REQUIRED:
        return "required"
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _description(info: FieldInfo, key: str, entry: type[BaseModel] | None) -> str:
    text = " ".join((info.description or "").split())
    if entry is not None:
        text = f"{text} Each entry's keys: `{key}.{PLACEHOLDER}` below.".strip()
    return text


def _unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` → X."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _variants(annotation: Any) -> list[type[BaseModel]]:
    """The models of a union of sections (sample.backend), [] for anything else."""
    if typing.get_origin(annotation) not in (Union, types.UnionType):
        return []
    members = [_unwrap(arg) for arg in typing.get_args(annotation)]
    return members if all(_is_section(member) for member in members) else []


def _variant_name(model: type[BaseModel]) -> str:
    return typing.get_args(model.model_fields["name"].annotation)[0]


def _mapped_section(annotation: Any) -> type[BaseModel] | None:
    """The section of each entry of a ``dict[str, Section]`` (envs.custom), None for anything else."""
    if typing.get_origin(annotation) is not dict:
        return None
    value = _unwrap(typing.get_args(annotation)[1])
    return value if _is_section(value) else None


def _type_text(info: FieldInfo, variants: list[type[BaseModel]], entry: type[BaseModel] | None) -> str:
    if variants:
        text = "one of " + " | ".join(f"`{_variant_name(v)}`" for v in variants) + " (by `name`)"
    elif entry is not None:
        text = f"`mapping of {PLACEHOLDER} → section`"
    else:
        text = f"`{_type_name(_unwrap(info.annotation))}`"
    bounds = [f"{symbol} {getattr(item, attribute)}" for item in info.metadata
              for kind, attribute, symbol in BOUNDS if isinstance(item, kind)]
    return ", ".join([text, *bounds])


def _type_name(annotation: Any) -> str:
    """A type as a reader of params.yaml writes it: ``int``, ``str | null``, ``"auto" | "cpu"``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(_unwrap(arg)) for arg in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return f"mapping {_type_name(args[0])} → {_type_name(args[1])}"
    return getattr(annotation, "__name__", str(annotation))


if __name__ == "__main__":
    sys.stdout.write(render_reference())
