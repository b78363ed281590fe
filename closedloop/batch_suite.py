"""The batch validation suite as plain data: which tables and columns a batch must have and which
expectations hold over them, a function of ``k`` alone. lineage/validation.py turns it into Great
Expectations checks; :func:`suite_fingerprint` versions it for lineage without importing GX, so the
reward stage can name the validator's version without running (or importing) the adapter."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

BUCKETS = ("positive", "partial", "error")

# column -> type name understood by GX's ExpectColumnValuesToBeOfType. "str" is used (not a dtype
# name) because it checks values one by one on object columns and also accepts pandas 3's default
# "str" dtype, which ExpectColumnValuesToBeInTypeList does not recognise under any name.
GRADED_COLUMNS: dict[str, str] = {
    "sample_id": "str",
    "task_id": "str",
    "env": "str",
    "slice": "str",
    "kind": "str",
    "sample_index": "int",
    "completion": "str",
    "model_version": "str",
    "prompt_tokens": "int",
    "completion_tokens": "int",
    "finish_reason": "str",
    "status": "str",
    "parses": "bool",
    "runs": "bool",
    "tests_passed": "int",
    "tests_total": "int",
    "reward": "float",
    "bucket": "str",
}
TASKS_COLUMNS: dict[str, str] = {"task_id": "str", "env": "str", "slice": "str", "kind": "str"}
FIXES_COLUMNS: dict[str, str] = {
    "pair_id": "str",
    "task_id": "str",
    "failed_sample_id": "str",
    "fixed_sample_id": "str",
    "prompt": "str",
    "completion": "str",
}
FIXES_REFS = ("task_id", "failed_sample_id", "fixed_sample_id")  # fixes columns that must resolve
PER_TASK_COLUMNS = ("task_id", "n_samples", "n_positive", "n_partial", "n_error", "n_bucketed")
PRESENCE = "ExpectTableColumnsToMatchSet"


@dataclass(frozen=True)
class Spec:
    table: str
    expectation: str  # GX class name in great_expectations.expectations
    kwargs: dict[str, Any]


def column_specs(table: str, columns: dict[str, str]) -> list[Spec]:
    # One table-level presence check instead of one per column: each GX expectation costs ~10 ms
    # of planning, and _failures splits a miss back into one failure per missing column.
    specs = [Spec(table, PRESENCE, {"column_set": list(columns), "exact_match": False})]
    for name, type_ in columns.items():
        specs += [
            Spec(table, "ExpectColumnValuesToNotBeNull", {"column": name}),
            Spec(table, "ExpectColumnValuesToBeOfType", {"column": name, "type_": type_}),
        ]
    return specs


def suite_specs(k: int, rounds: int = 1) -> list[Spec]:
    """The whole suite as data, in a stable order (the fingerprint hashes it). With episodes
    (``rounds`` > 1) every graded row also says how many rounds its episode used, 1 to ``rounds``."""
    between = "ExpectColumnValuesToBeBetween"
    specs = column_specs("graded", GRADED_COLUMNS) + [
        Spec("graded", "ExpectColumnValuesToBeUnique", {"column": "sample_id"}),
        Spec("graded", between, {"column": "reward", "min_value": 0.0, "max_value": 1.0}),
        Spec("graded", between, {"column": "sample_index", "min_value": 0, "max_value": k - 1}),
        Spec("graded", between, {"column": "prompt_tokens", "min_value": 0}),
        Spec("graded", between, {"column": "completion_tokens", "min_value": 0}),
        Spec("graded", between, {"column": "tests_passed", "min_value": 0}),
        Spec("graded", between, {"column": "tests_total", "min_value": 1}),
        Spec(
            "graded",
            "ExpectColumnPairValuesAToBeGreaterThanB",
            {"column_A": "tests_total", "column_B": "tests_passed", "or_equal": True},
        ),
        Spec("graded", "ExpectColumnValuesToBeInSet", {"column": "bucket", "value_set": list(BUCKETS)}),
        # expected_bucket is derived from the test counts by _expected_bucket
        Spec("graded", "ExpectColumnPairValuesToBeEqual", {"column_A": "bucket", "column_B": "expected_bucket"}),
        Spec("graded", "ExpectColumnValuesToBeNull", {"column": "orphan_task_id"}),
    ]
    if rounds > 1:
        specs += column_specs("graded", {"rounds": "int"}) + [
            Spec("graded", between, {"column": "rounds", "min_value": 1, "max_value": rounds}),
        ]
    specs += column_specs("tasks", TASKS_COLUMNS) + [
        Spec("tasks", "ExpectColumnValuesToBeUnique", {"column": "task_id"}),
    ]
    specs += column_specs("fixes", FIXES_COLUMNS) + [
        Spec("fixes", "ExpectColumnValuesToBeUnique", {"column": "pair_id"}),
        Spec("fixes", "ExpectColumnValueLengthsToBeBetween", {"column": "prompt", "min_value": 1}),
        Spec("fixes", "ExpectColumnValueLengthsToBeBetween", {"column": "completion", "min_value": 1}),
    ]
    specs += [Spec("fixes", "ExpectColumnValuesToBeNull", {"column": f"orphan_{c}"}) for c in FIXES_REFS]
    specs += [
        Spec("per_task", between, {"column": "n_samples", "min_value": k, "max_value": k}),
        Spec("per_task", "ExpectColumnPairValuesToBeEqual", {"column_A": "n_bucketed", "column_B": "n_samples"}),
    ]
    return specs


def suite_fingerprint(k: int, rounds: int = 1) -> str:
    """Short sha256 of the suite definition: the validator's version in lineage."""
    payload = json.dumps(
        [[s.table, s.expectation, s.kwargs] for s in suite_specs(k, rounds)], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
