"""Reusable rule validators: one JSON object, a small JSON-schema subset, field-level precision and
recall, line-oriented formats.

Pure stdlib and fast. Environments compose them into reward components (envs/extract.py,
envs/rules.py) instead of copying checks. Each returns a score in [0, 1] (or the parsed value) and a
short message naming the *first* problem ("" when there is none), which environments pass on as
feedback.

An environment's ``component_sources`` returns a validator with its config, and the component's
version hashes the validator's source (``inspect.getsource``), so any change to a validator must
change the version of every reward component built on it. ``parse_json``, ``field_scores`` and
``match_format`` keep their scoring logic inside their own bodies (helpers are nested);
``check_schema`` is split into module-level helpers, listed in ``CHECK_SCHEMA_HELPERS``, whose
sources the environment puts in the component's config (envs/extract.py). ``_show`` and
``_json_type`` only format messages.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any, NamedTuple, Sequence

_SHOW_CHARS = 40


def _show(value: Any) -> str:
    """A value as it reads in JSON, cut short: messages quote what the completion wrote."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 3] + "..."


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


class SchemaResult(NamedTuple):
    score: float  # fraction of the schema's checks the value satisfies
    message: str  # the first violation, "" when none
    satisfied: int
    total: int


class FieldScores(NamedTuple):
    precision: float  # of the fields the prediction gives, the share that is right
    recall: float  # of the fields the truth gives, the share the prediction got right
    f1: float
    message: str  # the first wrong, missing or unexpected field, "" when none

    @property
    def score(self) -> float:
        return self.f1


class FormatResult(NamedTuple):
    score: float  # fraction of lines that match (over the larger of expected and written)
    message: str  # the first line that does not match, or what is missing / extra
    groups: tuple[tuple[str, ...] | None, ...]  # each expected line's captured groups; None if it did not match


def parse_json(text: str) -> tuple[dict | None, str]:
    """Exactly one JSON object in ``text``: (the object, ""), else (None, why not).

    Whitespace around the object is fine; anything else is rejected: trailing text (a second object,
    prose, a closing code fence), a top-level value that is not an object, duplicate keys (which of
    the two values was meant?) and NaN / Infinity (Python's json accepts them; JSON does not).
    """
    if not isinstance(text, str):
        return None, f"expected text, got {type(text).__name__}"
    stripped = text.strip()
    if not stripped:
        return None, "empty output, expected a JSON object"

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
        result: dict = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    decoder = json.JSONDecoder(object_pairs_hook=unique_keys, parse_constant=no_constant)
    try:
        value, end = decoder.raw_decode(stripped)
    except json.JSONDecodeError as error:
        return None, f"not JSON: {error.msg} at char {error.pos}"
    except ValueError as error:
        return None, f"not JSON: {error}"
    except RecursionError:
        return None, "not JSON: nested too deeply"
    if end != len(stripped):
        return None, f"trailing text after the JSON object: {stripped[end:end + 20]!r}"
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
        return None, f"expected a JSON object, got {kind}"
    return value, ""


def check_schema(value: Any, schema: dict) -> SchemaResult:
    """How much of ``schema`` (a small JSON-schema subset) ``value`` satisfies, and its first violation.

    The subset: ``{"type": "object", "properties": {name: prop}, "required": [...],
    "additionalProperties": false}`` where each ``prop`` may have ``type`` (one of string, integer,
    number, boolean, array, object, null, or a list of them such as ``["string", "null"]``),
    ``enum``, ``minimum``, ``maximum`` (inclusive), ``format: "date"`` (YYYY-MM-DD and a real
    calendar date) and ``items: {"type": ...}``. An unknown keyword is a ValueError: the schema is
    trusted input, and a typo in it must not silently pass everything.

    Checks counted: per property, one for presence (if required), one for its type and one per
    constraint; one for ``additionalProperties: false``. The count depends only on the schema, so
    scores compare across completions. An absent optional property, or a null where null is
    allowed, satisfies its checks; a missing required one, or one of the wrong type, fails all of
    them. ``integer`` accepts 3.0 (as JSON Schema does); neither integer nor number accepts a
    boolean or a numeric string.
    """
    properties, required, checks_of, closed = _schema_checks(schema)
    if not isinstance(value, dict):
        count = sum(len(c) for c in checks_of.values()) + len(required) + closed
        return SchemaResult(0.0, f"expected a JSON object, got {_json_type(value)}", 0, max(count, 1))
    tally = _Tally()
    for name, spec in properties.items():
        _check_property(tally, name, spec, checks_of[name], value, required=name in required)
    if closed:
        extra = [key for key in value if key not in properties]
        tally.record(not extra, f"unexpected field {extra[0]!r}" if extra else "")
    if tally.total == 0:
        return SchemaResult(1.0, "", 0, 0)
    return SchemaResult(tally.satisfied / tally.total, tally.first, tally.satisfied, tally.total)


def _schema_checks(schema: dict) -> tuple[dict, set, dict[str, list[str]], bool]:
    """A schema's properties, required names, the checks of each property (after its type, the
    constraints it has) and whether ``additionalProperties`` is false; a ValueError for a schema
    outside check_schema's subset."""
    object_keywords = {"type", "properties", "required", "additionalProperties"}
    property_keywords = {"type", "enum", "minimum", "maximum", "format", "items"}
    unknown = set(schema) - object_keywords
    if unknown or schema.get("type", "object") != "object":
        raise ValueError(f"check_schema: only a top-level object schema with {sorted(object_keywords)} "
                         f"is supported, got {sorted(schema)}")
    properties: dict = schema.get("properties", {})
    required = set(schema.get("required", []))
    if required - set(properties):
        raise ValueError(f"check_schema: required field(s) {sorted(required - set(properties))} have no property")
    checks_of: dict[str, list[str]] = {}
    for name, spec in properties.items():
        unknown = set(spec) - property_keywords
        if unknown:
            raise ValueError(f"check_schema: property {name!r} has unsupported keyword(s) {sorted(unknown)}")
        if spec.get("format", "date") != "date":
            raise ValueError(f"check_schema: property {name!r} has unsupported format {spec['format']!r}")
        _declared_types(spec, f"property {name!r}")
        _declared_types(spec.get("items", {}), f"items of {name!r}")
        checks_of[name] = ["type"] * ("type" in spec) + [k for k in ("enum", "minimum", "maximum", "format", "items") if k in spec]
    closed = schema.get("additionalProperties", True) is False
    return properties, required, checks_of, closed


def _declared_types(spec: dict, where: str) -> list[str]:
    """The types a property (or its items) declares, as a list; an unknown one is a ValueError."""
    types = {"string", "integer", "number", "boolean", "array", "object", "null"}
    declared = spec.get("type", [])
    declared = [declared] if isinstance(declared, str) else list(declared)
    unknown = [t for t in declared if t not in types]
    if unknown:
        raise ValueError(f"check_schema: {where} has unknown type(s) {unknown}")
    return declared


def _has_type(item: Any, name: str) -> bool:
    """Whether a JSON value is of the JSON-schema type ``name``."""
    if name == "null":
        return item is None
    if name == "boolean":
        return isinstance(item, bool)
    if name == "integer":
        return (isinstance(item, int) and not isinstance(item, bool)) or (isinstance(item, float) and item.is_integer())
    if name == "number":
        return isinstance(item, (int, float)) and not isinstance(item, bool)
    return isinstance(item, {"string": str, "array": list, "object": dict}[name])


def _is_date(item: Any) -> bool:
    """Whether a value is a YYYY-MM-DD string naming a real calendar date."""
    if not isinstance(item, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", item):
        return False
    try:
        datetime.date(int(item[:4]), int(item[5:7]), int(item[8:]))
    except ValueError:
        return False
    return True


class _Tally:
    """check_schema's count: checks so far, the satisfied ones, and the first violation's message."""

    def __init__(self) -> None:
        self.total = self.satisfied = 0
        self.first = ""

    def record(self, ok: bool, message: str, weight: int = 1) -> None:
        self.total += weight
        self.satisfied += weight if ok else 0
        if not ok and not self.first:
            self.first = message


def _check_property(tally: _Tally, name: str, spec: dict, checks: list[str], value: dict, *, required: bool) -> None:
    """Count one property's checks of ``value``: its presence (if required), its type, its constraints."""
    if name not in value:
        if required:
            tally.record(False, f"field {name!r}: missing (required)", 1 + len(checks))
        else:
            tally.record(True, "", len(checks))
        return
    if required:
        tally.record(True, "")
    item = value[name]
    declared = _declared_types(spec, name)
    if item is None and "null" in declared:
        tally.record(True, "", len(checks))  # an allowed null: its constraints do not apply
        return
    if declared and not any(_has_type(item, t) for t in declared):
        tally.record(False, f"field {name!r}: expected {' or '.join(declared)}, got {_json_type(item)} {_show(item)}",
                     len(checks))
        return
    if declared:
        tally.record(True, "")
    _check_constraints(tally, name, spec, item)


def _check_constraints(tally: _Tally, name: str, spec: dict, item: Any) -> None:
    """Count the enum, minimum, maximum, format and items checks of a present value of the right type."""
    numeric = isinstance(item, (int, float)) and not isinstance(item, bool)
    if "enum" in spec:
        ok = any(item == option and type(item) is type(option) for option in spec["enum"])
        tally.record(ok, f"field {name!r}: {_show(item)} not one of {'|'.join(str(o) for o in spec['enum'])}")
    if "minimum" in spec:
        tally.record(not numeric or item >= spec["minimum"], f"field {name!r}: {_show(item)} below minimum {spec['minimum']}")
    if "maximum" in spec:
        tally.record(not numeric or item <= spec["maximum"], f"field {name!r}: {_show(item)} above maximum {spec['maximum']}")
    if "format" in spec:
        tally.record(not isinstance(item, str) or _is_date(item), f"field {name!r}: {_show(item)} is not a date YYYY-MM-DD")
    if "items" in spec:
        item_types = _declared_types(spec["items"], f"items of {name!r}")
        bad = [i for i, element in enumerate(item) if item_types and not any(_has_type(element, t) for t in item_types)] \
            if isinstance(item, list) else []
        tally.record(not bad, f"field {name!r}: item {bad[0] if bad else 0} is not {' or '.join(item_types)}" if bad else "")


# What check_schema's score depends on besides its own body: an environment versions its schema
# component with their sources too (envs/extract.py, component_sources).
CHECK_SCHEMA_HELPERS = (_schema_checks, _declared_types, _has_type, _is_date, _Tally, _check_property, _check_constraints)


def field_scores(predicted: dict, truth: dict, numeric_tolerance: float = 1e-6) -> FieldScores:
    """Field-level precision, recall and F1 of ``predicted`` against ``truth``, exact-match per field.

    A field is *given* when its value is not null: null and absent both mean "nothing", so a
    prediction that writes ``"po": null`` where the truth has no PO number is right, and one that
    writes a value there is a false positive. Two values match when:

    - strings: equal after Unicode NFC normalisation, stripping, and collapsing runs of whitespace
      to one space; case matters ("EUR" is not "eur": enumerations and names are case-exact);
    - numbers (int or float, never bool): within ``numeric_tolerance`` of each other, absolutely;
      a number never matches a string ("1200" is not 1200);
    - booleans: identical; lists: same length, pairwise matching; objects: same keys, matching values.

    precision = right / given by the prediction (1.0 when it gives nothing: nothing it says is
    wrong); recall = right / given by the truth (1.0 when the truth gives nothing). The message names
    the first problem in the truth's field order, then the prediction's unexpected fields.
    """
    import math
    import unicodedata

    def norm(text: str) -> str:
        return " ".join(unicodedata.normalize("NFC", text).split())

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, bool) or isinstance(b, bool):
            return isinstance(a, bool) and isinstance(b, bool) and a == b
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            try:
                return math.isfinite(a - b) and abs(a - b) <= numeric_tolerance
            except OverflowError:  # an int too large for a float: it matches nothing we generate
                return a == b
        if isinstance(a, str) and isinstance(b, str):
            return norm(a) == norm(b)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return a is None and b is None

    if not isinstance(predicted, dict):
        predicted = {}
    given_predicted = {k for k, v in predicted.items() if v is not None}
    given_truth = {k for k, v in truth.items() if v is not None}
    right = {k for k in given_predicted & given_truth if same(predicted[k], truth[k])}
    precision = len(right) / len(given_predicted) if given_predicted else 1.0
    recall = len(right) / len(given_truth) if given_truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    message = ""
    for key in list(truth) + [k for k in predicted if k not in truth]:
        if key in right or (key not in given_truth and key not in given_predicted):
            continue
        if key not in truth:
            message = f"unexpected field {key!r}: {_show(predicted[key])}"
        elif key not in given_predicted:
            message = f"field {key!r} is {'null' if key in predicted else 'missing'}, expected {_show(truth[key])}"
        else:
            message = f"field {key!r} is {_show(predicted[key])}, expected {_show(truth.get(key))}"
        break
    return FieldScores(precision, recall, f1, message)


def match_format(text: str, line_patterns: Sequence[str]) -> FormatResult:
    """Whether ``text`` is exactly one line per pattern, line i matching regex ``line_patterns[i]`` in full.

    Whitespace around the whole text, trailing spaces of each line and "\\r\\n" line ends are
    ignored; nothing else is (no blank lines between, no prose after). The score is the share of
    lines that match, over the larger of the expected and the written line count, so extra and
    missing lines both lower it; the groups of each matching line come back for the caller to read.
    """
    import re

    if not isinstance(text, str):
        text = ""
    lines = [line.rstrip() for line in text.strip().splitlines()] if text.strip() else []
    groups: list[tuple[str, ...] | None] = []
    first = ""
    for index, pattern in enumerate(line_patterns):
        if index >= len(lines):
            groups.append(None)
            first = first or f"missing line {index + 1} (expected {pattern})"
            continue
        found = re.fullmatch(pattern, lines[index])
        groups.append(found.groups() if found else None)
        if not found and not first:
            first = f"line {index + 1}: {lines[index][:_SHOW_CHARS]!r} does not match {pattern}"
    if len(lines) > len(line_patterns) and not first:
        first = f"extra line {len(line_patterns) + 1}: {lines[len(line_patterns)][:_SHOW_CHARS]!r}"
    denominator = max(len(lines), len(line_patterns))
    matched = sum(g is not None for g in groups)
    return FormatResult(matched / denominator if denominator else 1.0, first, tuple(groups))
