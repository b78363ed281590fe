"""Comparing the table a data task's solve() returned with the expected one, and what of the comparison
a model may be shown in an episode (envs/episodes.py).

:func:`compare_tables` gives the schema error, the fraction of expected cells matched and the first
value error, in words that quote expected values (columns, dtypes, row counts, cells): the verdict's
feedback. :func:`shown_difference` rewrites those words without them: what the result has, and where
it is wrong.
"""

from __future__ import annotations

import math
import re
from difflib import SequenceMatcher
from typing import Any

from closedloop.envs.episodes import between, is_named

_SHOWN = 60  # characters of a cell or column list a feedback message quotes
_MISSING = object()  # a cell of an expected column the result lacks


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _same_cell(want: Any, got: Any, tol: float) -> bool:
    if type(want) is bool or type(got) is bool or want is None or got is None:
        return type(want) is type(got) and want == got
    if type(want) in (int, float) and type(got) in (int, float):  # int vs float is the schema's business
        return math.isclose(want, got, rel_tol=tol, abs_tol=tol)
    return type(want) is type(got) and want == got


_RANK = {type(None): 0, bool: 1, int: 2, float: 2, str: 3}


def _row_key(row: list) -> tuple:
    """A hashable, totally ordered key of a row; floats rounded so near-equal values sort and match together."""
    return tuple((-1, 0) if v is _MISSING else (_RANK[type(v)], round(v, 6) if type(v) in (int, float) else v)
                 for v in row)


def compare_tables(expected: dict[str, Any], got: dict[str, Any] | str, order: str,
                   tol: float) -> tuple[str, float, str]:
    """(schema error or "", fraction of expected cells matched, first value error or "").

    Cells are compared on the expected columns (found by name in ``got``), on rows aligned in the
    order given (order "exact") or after sorting both sides (order "any"); the denominator is the
    larger row count times the expected column count, so missing and extra rows both cost.
    """
    if isinstance(got, str):
        return got, 0.0, got
    columns = expected["columns"]
    schema_error = ""
    if got["columns"] != columns:
        schema_error = f"columns {_short(got['columns'])} expected {_short(columns)}"
    else:
        for name, want, have in zip(columns, expected["dtypes"], got["dtypes"]):
            if want != have:
                schema_error = f"column {name!r} has dtype {have}, expected {want}"
                break
    where = [got["columns"].index(c) if c in got["columns"] else None for c in columns]
    want_rows = expected["rows"]
    have_rows = [[row[i] if i is not None else _MISSING for i in where] for row in got["rows"]]
    if order == "any":
        want_rows, have_rows = sorted(want_rows, key=_row_key), sorted(have_rows, key=_row_key)
    matched, first = 0, ""
    pairs = _aligned(want_rows, have_rows)
    for i, j in pairs:
        for name, want, have in zip(columns, want_rows[i], have_rows[j]):
            if have is not _MISSING and _same_cell(want, have, tol):
                matched += 1
            elif not first and have is not _MISSING:
                first = f"cell ({i}, {name!r}) is {_short(have)}, expected {_short(want)}"
    if len(want_rows) != len(have_rows):
        first = f"{len(have_rows)} rows, expected {len(want_rows)}"
    elif not first and len(pairs) < len(want_rows):  # the same rows, in another order
        i = min(set(range(len(want_rows))) - {i for i, _ in pairs})
        first = f"row {i} {_short(want_rows[i])} is out of place"
    total = max(len(want_rows), len(have_rows)) * len(columns)
    fraction = matched / total if total else 1.0  # total 0: both sides have no rows
    return schema_error, fraction, first or schema_error


def _aligned(want_rows: list[list], have_rows: list[list]) -> list[tuple[int, int]]:
    """(expected row, result row) pairs to compare: rows that match in sequence, and the rows between
    them side by side, so one extra or missing row costs that row rather than every row after it."""
    matcher = SequenceMatcher(None, [_row_key(r) for r in want_rows], [_row_key(r) for r in have_rows],
                              autojunk=False)
    pairs: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("equal", "replace"):
            pairs += zip(range(i1, i2), range(j1, j2))
    return pairs


def shown_difference(message: str, checks: dict[str, Any], prompt: str) -> str | None:
    """compare_tables' error ``message`` on a task with ``checks``, told without an expected value: the
    columns the result has (the expected ones too when ``prompt`` names every one), a column whose
    dtype is wrong, how many rows came back, the position and value of the first differing cell, a row
    out of place. None when the message is none of compare_tables' (the caller then shows less)."""
    expected, order = checks["expected"], checks["order"]
    columns = expected["columns"]
    got = between(message, "columns ", f" expected {_short(columns)}")
    if got is not None:
        if all(is_named(name, prompt) for name in columns):  # the task's own words: nothing held back
            return f"columns {got}, expected {_short(columns)}"
        return f"columns {got}: not the columns the task asks for"
    for name, want in zip(columns, expected["dtypes"]):
        have = between(message, f"column {name!r} has dtype ", f", expected {want}")
        if have is not None:
            return f"column {name!r} has dtype {have}: not the dtype the task asks for"
    counted = re.fullmatch(r"(\d+) rows, expected (\d+)", message)
    if counted and int(counted.group(2)) == len(expected["rows"]):
        return f"{counted.group(1)} rows returned: not the number of rows the task asks for"
    rows = sorted(expected["rows"], key=_row_key) if order == "any" else expected["rows"]
    found = re.match(r"(?:cell \(|row )(\d+)", message)
    index = int(found.group(1)) if found else len(rows)
    if index >= len(rows):
        return message if message == "some cells differ" or _result_error(message) else None
    for name, want in zip(columns, rows[index]):
        have = between(message, f"cell ({index}, {name!r}) is ", f", expected {_short(want)}")
        if have is not None:
            where = " (rows compared in sorted order)" if order == "any" else ""
            return f"cell ({index}, {name!r}) is {have}: not the value the task asks for{where}"
    if message == f"row {index} {_short(rows[index])} is out of place":
        return f"row {index} is out of place"
    return None


def _result_error(message: str) -> bool:
    """Whether ``message`` says the result was no table (data._as_table's words): nothing expected in it."""
    return (message == "solve's result could not be read as a table"
            or between(message, "solve returned ", ", not a DataFrame") is not None)
