"""Batch validation with Great Expectations: the gate between grading and training.

The only module that imports ``great_expectations`` (lazily: the import alone takes ~3 s). The suite
is declared as plain data in closedloop/batch_suite.py, versioned there without importing GX. The suite is a function of ``k`` alone.

Four tables are validated: ``graded``, ``tasks``, ``fixes`` and ``per_task``, a table derived from
``tasks`` LEFT JOIN ``graded`` so a task that got no samples shows up with ``n_samples == 0`` instead of
vanishing from a group-by. Cross-table rules become derived columns checked by ordinary expectations:
``expected_bucket`` (the bucket the test counts imply) and ``orphan_<ref>`` (the reference where it
points nowhere, else null). Orphan columns rather than ``value_set=<all ids>``: GX re-serialises an
expectation's kwargs many times per run, and a 6,400-id value set made validation ~10x slower; they
also make failures quote the dangling ids themselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from closedloop.batch_suite import BUCKETS, FIXES_REFS, PER_TASK_COLUMNS, Spec, suite_specs

# The column that names a row in failure messages ("at sample_id ['s7']"), per table.
_ROW_KEY = {"graded": "sample_id", "tasks": "task_id", "fixes": "pair_id", "per_task": "task_id"}
_EXAMPLES = 5  # unexpected values quoted per failure
_SITE = "closedloop"


@dataclass(frozen=True)
class ExpectationFailure:
    table: str
    expectation: str  # GX type, e.g. "expect_column_values_to_be_between"
    column: str | None
    details: str  # e.g. "1 unexpected value(s), e.g. [1.5]; kwargs min_value=0.0 max_value=1.0"


@dataclass
class ValidationReport:
    success: bool
    evaluated: int  # expectations evaluated, over all tables
    failures: list[ExpectationFailure] = field(default_factory=list)
    docs_index: str | None = None  # path of the Data Docs index.html

    def summary(self) -> str:
        if self.success:
            return f"all {self.evaluated} expectations passed"
        return "\n".join(
            f"table '{f.table}': {f.expectation}"
            + (f"(column={f.column})" if f.column else "")
            + f": {f.details}"
            for f in self.failures
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- derived tables (pandas, imported lazily by the callers) -------------------------------------


def _expected_bucket(graded: Any) -> Any:
    """The bucket the rule implies ("invalid" for impossible counts); None if a count column is missing."""
    import pandas as pd

    if not {"tests_passed", "tests_total"} <= set(graded.columns):
        return None
    passed = pd.to_numeric(graded["tests_passed"], errors="coerce")
    total = pd.to_numeric(graded["tests_total"], errors="coerce")
    out = pd.Series("invalid", index=graded.index, dtype=object)  # e.g. passed > total, or not a number
    out[(passed > 0) & (passed < total)] = "partial"
    out[passed == 0] = "error"
    out[(passed == total) & (total > 0)] = "positive"
    return out


def _per_task(graded: Any, tasks: Any) -> Any:
    """tasks LEFT JOIN per-task counts of graded: a task with no samples keeps a row of zeros."""
    import pandas as pd

    ids = tasks["task_id"].drop_duplicates() if "task_id" in tasks.columns else pd.Series([], dtype=object)
    table = pd.DataFrame({"task_id": ids.to_numpy()})
    if "task_id" in graded.columns:
        counts = graded.groupby("task_id").size().rename("n_samples")
        table = table.merge(counts, how="left", left_on="task_id", right_index=True)
        if "bucket" in graded.columns:
            by_bucket = pd.crosstab(graded["task_id"], graded["bucket"]).reindex(columns=list(BUCKETS), fill_value=0)
            by_bucket.columns = [f"n_{b}" for b in BUCKETS]
            table = table.merge(by_bucket, how="left", left_on="task_id", right_index=True)
    for col in PER_TASK_COLUMNS[1:-1]:
        table[col] = table[col].fillna(0).astype("int64") if col in table.columns else 0
    table["n_bucketed"] = table[[f"n_{b}" for b in BUCKETS]].sum(axis=1).astype("int64")
    return table[list(PER_TASK_COLUMNS)]


def _orphans(refs: Any, column: str, targets: Any, key: str) -> Any:
    """refs[column] where it is not a value of targets[key], else null (the column checked by GX)."""
    import pandas as pd

    if column not in refs.columns:
        return None
    known = targets[key] if key in targets.columns else pd.Series([], dtype=object)
    values = refs[column].astype(object)
    return values.where(~values.isin(set(known.dropna())) & values.notna(), None)


def _derived_tables(graded: Any, tasks: Any, fixes: Any) -> dict[str, Any]:
    """Copies of the inputs with the derived columns the suite checks, plus the per-task table."""
    graded, fixes = graded.copy(), fixes.copy()  # never mutate the caller's frames
    derived = [
        (graded, "expected_bucket", _expected_bucket(graded)),
        (graded, "orphan_task_id", _orphans(graded, "task_id", tasks, "task_id")),
    ]
    for ref in FIXES_REFS:
        target, key = (tasks, "task_id") if ref == "task_id" else (graded, "sample_id")
        derived.append((fixes, f"orphan_{ref}", _orphans(fixes, ref, target, key)))
    for frame, name, values in derived:
        if values is not None:  # else its input column is missing, which is reported as such
            frame[name] = values
    return {"graded": graded, "tasks": tasks, "fixes": fixes, "per_task": _per_task(graded, tasks)}


# --- GX -------------------------------------------------------------------------------------------


def _context(docs_dir: Path) -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    site = {
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        data_docs_sites={_SITE: site},
        analytics_enabled=False,  # offline machines; no telemetry
        progress_bars=ProgressBarsConfig(globally=False),  # tqdm bars would flood stage logs
    )
    # get_context (not the class) also registers it as GX's active project, which suites require
    return gx.get_context(mode="ephemeral", project_config=config)


def _plain(value: Any) -> Any:
    """numpy scalars and tuples -> JSON-friendly Python values for messages."""
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        try:
            return value.item()
        except (ValueError, TypeError):
            return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _fmt_kwarg(value: Any) -> str:
    if isinstance(value, (list, tuple, set)) and len(value) > 8:
        return f"<{len(value)} values>"
    return repr(_plain(value))


def _exception_message(info: Any) -> str | None:
    # exception_info is either flat ({raised_exception, exception_message, ...}) or keyed by metric id.
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for sub in info.values():
        if isinstance(sub, dict) and sub.get("raised_exception"):
            return str(sub.get("exception_message"))
    return None


def _failures(table: str, res: Any) -> list[tuple[ExpectationFailure, bool]]:
    """One failed GX result -> [(record, whether it is an evaluation error rather than a verdict)]."""
    kind = res.expectation_config.type
    kwargs = dict(res.expectation_config.kwargs)
    kwargs.pop("batch_id", None)
    if kind == "expect_table_columns_to_match_set" and res.result:
        missing = (res.result.get("details") or {}).get("mismatched", {}).get("missing") or []
        if missing:
            return [(ExpectationFailure(table, kind, str(c), "column is missing"), False) for c in missing]
    column = kwargs.pop("column", None) or kwargs.pop("column_A", None)
    error = _exception_message(res.exception_info)
    result = res.result or {}
    if error is not None:
        text = f"could not evaluate: {error}"
    elif "unexpected_count" in result:
        examples = [_plain(v) for v in (result.get("partial_unexpected_list") or [])[:_EXAMPLES]]
        text = f"{result['unexpected_count']} unexpected value(s), e.g. {examples}"
        rows = result.get("partial_unexpected_index_list") or []
        key = _ROW_KEY[table]
        keys = [_plain(r.get(key)) for r in rows[:_EXAMPLES] if isinstance(r, dict) and key in r]
        if keys:
            text += f" at {key} {keys}"
    elif "observed_value" in result:
        text = f"observed {_plain(result['observed_value'])!r}"
    else:
        text = "failed"
    if kwargs:
        text += "; kwargs " + " ".join(f"{k}={_fmt_kwarg(v)}" for k, v in kwargs.items())
    return [(ExpectationFailure(table, kind, column, text), error is not None)]


def validate_batch(graded: Any, tasks: Any, fixes: Any, *, k: int, docs_dir: Path, rounds: int = 1) -> ValidationReport:
    """Validate one batch's tables against the suite and write the GX Data Docs site to docs_dir."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    frames = _derived_tables(graded, tasks, fixes)

    docs_dir = Path(docs_dir).resolve()
    docs_dir.mkdir(parents=True, exist_ok=True)
    context = _context(docs_dir)
    source = context.data_sources.add_pandas("closedloop")
    by_table: dict[str, list[Spec]] = {}
    for spec in suite_specs(k, rounds):
        by_table.setdefault(spec.table, []).append(spec)

    evaluated = 0
    failures: list[ExpectationFailure] = []
    for table, specs in by_table.items():
        frame = frames[table]
        batch_def = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe("all")
        # all expectations at construction: suite.add_expectation re-saves the whole suite each time
        expectations = [getattr(gxe, spec.expectation)(**spec.kwargs) for spec in specs]
        suite = context.suites.add(gx.ExpectationSuite(name=f"closedloop.{table}", expectations=expectations))
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"closedloop.{table}", data=batch_def, suite=suite)
        )
        result_format: dict[str, Any] = {"result_format": "SUMMARY"}
        key = _ROW_KEY[table]
        if key in frame.columns and frame[key].is_unique:
            # names the offending rows in messages; GX needs the key column present (and unique to be useful)
            result_format["unexpected_index_column_names"] = [key]
        run = definition.run(batch_parameters={"dataframe": frame}, result_format=result_format)
        evaluated += len(run.results)
        table_failures = [pair for r in run.results if not r.success for pair in _failures(table, r)]
        missing = any(f.details == "column is missing" for f, _ in table_failures)
        # A missing column makes every other check on it error out; report the cause, not the echoes.
        failures += [f for f, is_error in table_failures if not (missing and is_error)]

    urls = context.build_data_docs(site_names=[_SITE])
    index = docs_dir / "index.html"
    docs_index = str(index) if _SITE in urls and index.exists() else None
    return ValidationReport(success=not failures, evaluated=evaluated, failures=failures, docs_index=docs_index)
