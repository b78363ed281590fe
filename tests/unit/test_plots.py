"""The plot data DVC draws (closedloop/reports/plots.py): rows from plain records, and their declarations."""

import json

import pytest

from closedloop.reports.plots import (
    BENCHMARK,
    DEFINITIONS,
    HISTORY,
    PERSISTENT,
    TEMPLATES,
    WRITERS,
    benchmark_rows,
    bucket_rows,
    history_rows,
    reward_histogram,
    write_templates,
)


def _evaluation(champion: dict, candidate: dict) -> dict:
    """An evaluation.json with the given pass@1 per environment (overall: their mean)."""
    def summary(envs):
        return {"overall": {"pass@1": sum(envs.values()) / len(envs)},
                "envs": {env: {"pass@1": value} for env, value in envs.items()}, "slices": {}}
    return {"champion": {"summary": summary(champion)}, "candidate": {"summary": summary(candidate)}}


class TestBenchmarkRows:
    def test_one_row_per_environment_and_model_overall_first(self):
        rows = benchmark_rows(_evaluation({"data": 0.5, "code": 0.25}, {"data": 0.75, "code": 0.25}))
        assert rows == [
            {"env": "overall", "model": "champion", "pass@1": 0.375},
            {"env": "code", "model": "champion", "pass@1": 0.25},
            {"env": "data", "model": "champion", "pass@1": 0.5},
            {"env": "overall", "model": "candidate", "pass@1": 0.5},
            {"env": "code", "model": "candidate", "pass@1": 0.25},
            {"env": "data", "model": "candidate", "pass@1": 0.75},
        ]


class TestHistoryRows:
    first = _evaluation({"code": 0.0}, {"code": 0.5})
    second = _evaluation({"code": 0.5}, {"code": 1.0})

    def test_each_iteration_adds_its_rows(self):
        rows = history_rows(history_rows([], 1, self.first), 2, self.second)
        assert [(r["iteration"], r["env"], r["pass@1"], r["champion_pass@1"]) for r in rows] == [
            (1, "overall", 0.5, 0.0), (1, "code", 0.5, 0.0), (2, "overall", 1.0, 0.5), (2, "code", 1.0, 0.5)]

    def test_rerunning_an_iteration_replaces_its_rows_and_writes_the_same_rows(self):
        once = history_rows(history_rows([], 1, self.first), 2, self.second)
        assert history_rows(once, 2, self.second) == once  # `dvc repro --force` of iteration 2
        assert history_rows(once, 1, self.second)[0]["pass@1"] == 1.0  # iteration 1 re-scored, 2 kept
        assert len(history_rows(once, 1, self.second)) == 4

    def test_an_earlier_iteration_rerun_keeps_the_order(self):
        rows = history_rows(history_rows([], 2, self.second), 1, self.first)
        assert [r["iteration"] for r in rows] == [1, 1, 2, 2]


class TestRewardHistogram:
    @pytest.mark.parametrize("reward, expected_bin", [
        (0.0, "0.0-0.1"),  # the lower edge belongs to the first bin
        (0.05, "0.0-0.1"),
        (0.1, "0.1-0.2"),  # an inner edge belongs to the bin above it
        (0.999, "0.9-1.0"),
        (1.0, "0.9-1.0"),  # a perfect reward is in the last bin, not an eleventh
        (-0.2, "0.0-0.1"),  # outside [0, 1]: the nearest end bin
        (1.5, "0.9-1.0"),
    ])
    def test_bins(self, reward, expected_bin):
        rows = reward_histogram([{"env": "code", "reward": reward}])
        assert [row["bin"] for row in rows if row["count"]] == [expected_bin]

    def test_every_bin_of_every_environment_listed_and_counts_add_up(self):
        rewards = [{"env": "code", "reward": 0.0}] * 3 + [{"env": "rules", "reward": 1.0}] * 2
        rows = reward_histogram(rewards)
        assert len(rows) == 2 * 10
        assert {env: sum(r["count"] for r in rows if r["env"] == env) for env in ("code", "rules")} == \
            {"code": 3, "rules": 2}
        assert rows[0] == {"env": "code", "bin": "0.0-0.1", "low": 0.0, "count": 3}


class TestBucketRows:
    def test_every_bucket_per_environment_even_empty(self):
        graded = [{"env": "code", "bucket": "positive"}, {"env": "code", "bucket": "error"},
                  {"env": "data", "bucket": "error"}]
        assert bucket_rows(graded) == [
            {"env": "code", "bucket": "positive", "count": 1}, {"env": "code", "bucket": "partial", "count": 0},
            {"env": "code", "bucket": "error", "count": 1}, {"env": "data", "bucket": "positive", "count": 0},
            {"env": "data", "bucket": "partial", "count": 0}, {"env": "data", "bucket": "error", "count": 1}]


def test_every_declared_plot_has_data_and_every_template_exists():
    files = {file for _, spec in DEFINITIONS for file in spec["y"]}
    assert files == set(WRITERS)
    assert PERSISTENT == {HISTORY} and BENCHMARK in WRITERS
    assert {spec["template"] for _, spec in DEFINITIONS} <= set(TEMPLATES)


def test_templates_are_written_where_dvc_looks_them_up(tmp_path):
    from dvc_render.vega_templates import get_template

    paths = write_templates(tmp_path)
    assert sorted(p.name for p in paths) == sorted(f"{name}.json" for name in TEMPLATES)
    for name in TEMPLATES:
        template = get_template(name, str(tmp_path / ".dvc" / "plots"))
        assert template.has_anchor("data") and template.content == json.loads(json.dumps(TEMPLATES[name]))
    before = [p.stat().st_mtime_ns for p in paths]
    write_templates(tmp_path)  # again: nothing rewritten
    assert [p.stat().st_mtime_ns for p in paths] == before
