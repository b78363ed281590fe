"""validate_batch against a real ephemeral GX context: one clean batch, then one corruption per row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("great_expectations")

from closedloop.lineage.validation import (  # noqa: E402
    ExpectationFailure,
    ValidationReport,
    validate_batch,
)
from closedloop.batch_suite import suite_fingerprint  # noqa: E402

K = 2


def _bucket(passed: int, total: int) -> str:
    return "positive" if passed == total else ("error" if passed == 0 else "partial")


def make_batch(n_tasks: int = 3, k: int = K) -> tuple:
    """A consistent batch: n_tasks tasks, k samples each, every bucket represented."""
    rows = []
    for t in range(n_tasks):
        for i in range(k):
            passed, total = (t + i) % 4, 3
            passed = min(passed, total)
            rows.append(
                dict(
                    sample_id=f"t{t}-s{i}", task_id=f"t{t}", env="code", slice="core", kind="arith",
                    sample_index=i, completion="" if i == 0 else "def f(): pass", model_version="v1",
                    prompt_tokens=12, completion_tokens=7, finish_reason="stop", status="ok",
                    parses=True, runs=passed > 0, tests_passed=passed, tests_total=total,
                    reward=passed / total, bucket=_bucket(passed, total),
                )
            )
    graded = pd.DataFrame(rows)
    tasks = pd.DataFrame(
        {"task_id": [f"t{t}" for t in range(n_tasks)], "env": "code", "slice": "core", "kind": "arith"}
    )
    fixes = pd.DataFrame(
        {
            "pair_id": ["p0"], "task_id": ["t0"], "failed_sample_id": ["t0-s0"],
            "fixed_sample_id": ["t0-s1"], "prompt": ["Write f"], "completion": ["def f(): return 1"],
        }
    )
    return graded, tasks, fixes


@pytest.fixture(scope="module")
def corrupted_report(tmp_path_factory: pytest.TempPathFactory) -> ValidationReport:
    """One batch carrying every corruption the table below looks for: one GX run instead of ten."""
    graded, tasks, fixes = make_batch()
    graded.loc[0, "reward"] = 1.5
    graded.loc[0, "env"] = None
    graded.loc[1, "sample_id"] = "t0-s0"
    graded.loc[1, "tests_passed"] = 9
    graded.loc[2, "task_id"] = "ghost"
    graded.loc[graded.index[graded.bucket == "positive"][0], "bucket"] = "partial"
    graded["prompt_tokens"] = graded["prompt_tokens"].astype(str)
    tasks.loc[1, "task_id"] = "t0"
    fixes.loc[0, "fixed_sample_id"] = "nope"
    fixes.loc[0, "completion"] = ""
    return validate_batch(graded, tasks, fixes, k=K, docs_dir=tmp_path_factory.mktemp("docs"))


def _find(report: ValidationReport, table: str, expectation: str, column: str | None) -> ExpectationFailure:
    hits = [f for f in report.failures if (f.table, f.expectation, f.column) == (table, expectation, column)]
    assert hits, f"no {expectation}({column}) on {table}; got:\n{report.summary()}"
    return hits[0]


class TestValidateBatch:
    def test_clean_batch_passes_and_writes_docs(self, tmp_path: Path) -> None:
        graded, tasks, fixes = make_batch()
        report = validate_batch(graded, tasks, fixes, k=K, docs_dir=tmp_path / "docs")
        assert report.success, report.summary()
        assert report.failures == [] and report.evaluated > 50
        assert report.docs_index == str((tmp_path / "docs" / "index.html").resolve())
        assert Path(report.docs_index).is_file()
        json.dumps(report.to_dict())  # JSON-serialisable as promised
        assert "reward" in graded.columns and "expected_bucket" not in graded.columns  # input untouched

    def test_empty_fixes_pass(self, tmp_path: Path) -> None:
        graded, tasks, fixes = make_batch()
        report = validate_batch(graded, tasks, fixes.iloc[0:0], k=K, docs_dir=tmp_path)
        assert report.success, report.summary()

    def test_summary_line_format(self, corrupted_report: ValidationReport) -> None:
        assert (
            "table 'graded': expect_column_values_to_be_between(column=reward): 1 unexpected value(s), e.g. [1.5]"
            in corrupted_report.summary()
        )

    @pytest.mark.parametrize(
        "table, expectation, column, in_details",
        [
            # reward out of [0, 1]: the between check names the value and its bounds
            ("graded", "expect_column_values_to_be_between", "reward", "e.g. [1.5]; kwargs min_value=0.0 max_value=1.0"),
            # two samples share an id
            ("graded", "expect_column_values_to_be_unique", "sample_id", "'t0-s0'"),
            # a bucket that contradicts the counts (all passed, labelled partial)
            ("graded", "expect_column_pair_values_to_be_equal", "bucket", "['partial', 'positive']"),
            # more tests passed than exist (and so no bucket the rule can give)
            ("graded", "expect_column_pair_values_a_to_be_greater_than_b", "tests_total", "[[3, 9]]"),
            # a sample of a task that is not in the batch's task table
            ("graded", "expect_column_values_to_be_null", "orphan_task_id", "'ghost'"),
            # a null in a required column
            ("graded", "expect_column_values_to_not_be_null", "env", "1 unexpected"),
            # a string where an int belongs
            ("graded", "expect_column_values_to_be_of_type", "prompt_tokens", "observed"),
            # duplicate task rows
            ("tasks", "expect_column_values_to_be_unique", "task_id", "'t0'"),
            # a fix pointing at a sample that does not exist
            ("fixes", "expect_column_values_to_be_null", "orphan_fixed_sample_id", "'nope'"),
            # a fix with an empty completion
            ("fixes", "expect_column_value_lengths_to_be_between", "completion", "1 unexpected"),
        ],
    )
    def test_corruption_is_named(self, corrupted_report, table, expectation, column, in_details) -> None:
        assert not corrupted_report.success
        failure = _find(corrupted_report, table, expectation, column)
        assert in_details in failure.details, failure.details

    def test_task_sampled_k_minus_1_times_fails_per_task(self, tmp_path: Path) -> None:
        graded, tasks, fixes = make_batch()
        graded = graded[graded.sample_id != "t2-s1"]  # t2 now has k-1 samples
        report = validate_batch(graded, tasks, fixes, k=K, docs_dir=tmp_path)
        failure = _find(report, "per_task", "expect_column_values_to_be_between", "n_samples")
        assert "e.g. [1] at task_id ['t2']" in failure.details

    def test_task_without_samples_shows_zero(self, tmp_path: Path) -> None:
        graded, tasks, fixes = make_batch()
        tasks = pd.concat([tasks, pd.DataFrame([{"task_id": "t9", "env": "code", "slice": "core", "kind": "arith"}])])
        report = validate_batch(graded, tasks, fixes, k=K, docs_dir=tmp_path)
        failure = _find(report, "per_task", "expect_column_values_to_be_between", "n_samples")
        assert "e.g. [0] at task_id ['t9']" in failure.details

    def test_episodes_say_how_many_rounds_each_used_within_sample_rounds(self, tmp_path: Path) -> None:
        from closedloop.batch_suite import suite_fingerprint

        graded, tasks, fixes = make_batch()
        graded["rounds"] = [1 + i % 3 for i in range(len(graded))]
        report = validate_batch(graded, tasks, fixes, k=K, docs_dir=tmp_path / "ok", rounds=3)
        assert report.success, report.summary()
        graded.loc[0, "rounds"] = 4
        report = validate_batch(graded, tasks, fixes, k=K, docs_dir=tmp_path / "over", rounds=3)
        assert "e.g. [4]" in _find(report, "graded", "expect_column_values_to_be_between", "rounds").details
        report = validate_batch(graded.drop(columns=["rounds"]), tasks, fixes, k=K, docs_dir=tmp_path / "gone", rounds=3)
        assert _find(report, "graded", "expect_table_columns_to_match_set", "rounds").details == "column is missing"
        # single attempts: the suite, and so the validator's version, as before episodes existed
        assert suite_fingerprint(K) == suite_fingerprint(K, 1) != suite_fingerprint(K, 3)

    def test_missing_column_is_one_clear_failure(self, tmp_path: Path) -> None:
        graded, tasks, fixes = make_batch()
        report = validate_batch(graded.drop(columns=["reward"]), tasks, fixes, k=K, docs_dir=tmp_path)
        failure = _find(report, "graded", "expect_table_columns_to_match_set", "reward")
        assert failure.details == "column is missing"
        # its echoes (null/type/range checks that cannot run on an absent column) are not reported
        assert [f.column for f in report.failures] == ["reward"], report.summary()

    def test_missing_count_columns_do_not_raise(self, tmp_path: Path) -> None:
        graded, tasks, fixes = make_batch()
        report = validate_batch(
            graded.drop(columns=["tests_passed", "task_id"]), tasks.drop(columns=["task_id"]), fixes,
            k=K, docs_dir=tmp_path,
        )
        missing = {(f.table, f.column) for f in report.failures if f.details == "column is missing"}
        assert {("graded", "tests_passed"), ("graded", "task_id"), ("tasks", "task_id")} <= missing


class TestSuiteFingerprint:
    def test_stable_and_depends_on_k(self) -> None:
        assert suite_fingerprint(4) == suite_fingerprint(4)
        assert suite_fingerprint(4) != suite_fingerprint(8)
        assert len(suite_fingerprint(4)) == 12
