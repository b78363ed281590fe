"""The names of an iteration's MLflow metrics (closedloop/lineage/run_metrics.py): the headline
first, each figure once, sections by prefix."""

from __future__ import annotations

import pytest

from closedloop.lineage.run_metrics import (
    CHAMPION_PASS_AT_1,
    PASS_AT_1,
    PROMOTED,
    REWARD_MEAN,
    headline,
    run_figures,
    stage_figures,
    timing_figures,
)

# Trimmed from the metrics files of a real iteration.
EVALUATE = {"candidate_pass@1": 0.39, "candidate_pass@1/code": 0.69, "candidate_pass@1/code/core": 0.65,
            "champion_pass@1": 0.36, "champion_pass@1/code": 0.61, "champion_pass@1/code/core": 0.62,
            "seconds": 49.1}
SUMMARY = {"overall": {"pass@1": 0.39}, "envs": {"code": {"pass@1": 0.69}, "data": {"pass@1": 0.41}}}


def _section(name: str) -> str:
    """Where MLflow 3's UI puts a metric's chart: the part of its name before the last '/'."""
    return name.rsplit("/", 1)[0] if "/" in name else "Model metrics"


class TestStageFigures:
    @pytest.mark.parametrize("stage, metrics, expected", [
        # headline figures are not repeated; a slice's '/' becomes '.' so it does not make a section
        ("evaluate", EVALUATE, {"stage/evaluate/candidate_pass_at_1.code.core": 0.65}),
        ("warmstart", {"benchmark_pass@1": 0.2, "benchmark_pass@1/code": 0.4, "benchmark_pass@1/code/edge": 0.5,
                       "final_loss": 0.02, "lora": False, "base_model": "builtin:tiny"},
         {"stage/warmstart/benchmark_pass_at_1.code.edge": 0.5, "stage/warmstart/final_loss": 0.02,
          "stage/warmstart/lora": 0.0}),
        # nested dicts flatten with '.', booleans are 0/1, strings and lists are not figures
        ("grade", {"buckets": {"positive": 3, "error": 1}, "reward_mean": 0.6, "reward_std": 0.3, "ok": True},
         {"stage/grade/buckets.positive": 3.0, "stage/grade/buckets.error": 1.0, "stage/grade/reward_std": 0.3,
          "stage/grade/ok": 1.0}),
        ("sample", {"samples": 8, "settings_mismatches": [], "backend": "hf", "finish_reasons": {"eos": 8}},
         {"stage/sample/samples": 8.0, "stage/sample/finish_reasons.eos": 8.0}),
        # counts the params decide, and keys named after data, would be a new metric every iteration
        ("generate", {"tasks": 10, "per_env": {"code": 10}, "per_kind": {"code/arith": 4}},
         {"stage/generate/tasks": 10.0, "stage/generate/per_env.code": 10.0}),
        ("train", {"steps": 2, "replay": {"iter-001-1e5f9e2f": 3}, "examples": {"replay": 3}},
         {"stage/train/steps": 2.0, "stage/train/examples.replay": 3.0}),
        # gate's promote and promote's promoted are the headline's loop/promoted
        ("gate", {"promote": True, "overall_delta": 0.03, "trained": True},
         {"stage/gate/overall_delta": 0.03, "stage/gate/trained": 1.0}),
        ("promote", {"promoted": True, "model_version": "abc"}, {}),
        # a per-environment reward mean is not the batch's; a pass rate per environment is grade's
        ("reward", {"reward_mean": 0.6, "per_env": {"code": {"reward_mean": 0.8, "pass_rate": 0.5}},
                    "status": {"code/passed": 3}},
         {"stage/reward/per_env.code.reward_mean": 0.8, "stage/reward/status.code.passed": 3.0}),
        ("evaluate", {"champion_pass@1/code/core": 0.3, "candidate_pass@1/code": 0.5}, {}),
    ])
    def test_table(self, stage, metrics, expected) -> None:
        assert stage_figures(stage, metrics) == expected


class TestTimingFigures:
    def test_from_the_timing_file(self) -> None:
        timing = {"seconds": 12.5, "cpu_seconds": 20.0, "peak_rss_mb": 900.0, "gpu_peak_mb": 1500.0}
        assert timing_figures("train", timing, {"seconds": 12.4}) == {
            "timing/train": 12.5, "system/train/cpu_seconds": 20.0, "system/train/peak_rss_mb": 900.0,
            "system/train/gpu_peak_mb": 1500.0}

    def test_without_a_timing_file_the_metrics_seconds(self) -> None:
        assert timing_figures("train", None, {"seconds": 12.4}) == {"timing/train": 12.4}
        assert timing_figures("train", None, {}) == {}

    def test_throughput_is_a_system_figure(self) -> None:
        timing = {"seconds": 3.0, "cpu_seconds": 5.0, "tokens_per_s": 120.5, "verifications_per_s/code": 9.0}
        assert timing_figures("reward", timing, {}) == {
            "timing/reward": 3.0, "system/reward/cpu_seconds": 5.0, "system/reward/tokens_per_s": 120.5,
            "system/reward/verifications_per_s.code": 9.0}

    def test_no_gpu_figure_without_cuda(self) -> None:
        assert "system/sample/gpu_peak_mb" not in timing_figures("sample", {"seconds": 1.0, "cpu_seconds": 1.0}, {})


class TestHeadline:
    def test_candidate_champion_promoted_reward(self) -> None:
        figures = headline(SUMMARY, {**SUMMARY, "overall": {"pass@1": 0.3}}, promoted=False, reward_mean=0.5)
        assert figures == {PASS_AT_1: 0.39, f"{PASS_AT_1}.code": 0.69, f"{PASS_AT_1}.data": 0.41,
                           CHAMPION_PASS_AT_1: 0.3, f"{CHAMPION_PASS_AT_1}.code": 0.69,
                           f"{CHAMPION_PASS_AT_1}.data": 0.41, PROMOTED: 0.0, REWARD_MEAN: 0.5}

    def test_warm_start_has_no_champion(self) -> None:
        assert set(headline(SUMMARY, None, promoted=True, reward_mean=None)) == {
            PASS_AT_1, f"{PASS_AT_1}.code", f"{PASS_AT_1}.data", PROMOTED}

    def test_headline_section_sorts_first(self) -> None:
        """MLflow sorts sections by name: the headline's comes before every stage's, system's and timing's."""
        figures = run_figures({"evaluate": EVALUATE, "grade": {"samples": 3}}, {"grade": {"seconds": 1, "cpu_seconds": 1}},
                              headline(SUMMARY, SUMMARY, promoted=True, reward_mean=0.5))
        sections = sorted({_section(name) for name in figures})
        assert sections[0] == "loop"
        assert {_section(name) for name in headline(SUMMARY, SUMMARY, promoted=True, reward_mean=0.5)} == {"loop"}
        assert "Model metrics" not in sections  # every figure is in a named section
        assert {"stage/evaluate", "stage/grade", "system/grade", "timing"} <= set(sections)


class TestMonitorFigures:
    # metrics/monitors.json as the monitors stage writes it (trimmed)
    MONITORS = {"anomaly_rates": {"value": 0.4, "verdict_code": 2, "all.timeout": 0.4, "code.timeout_jump": 0.4},
                "grpo_health": {"verdict_code": -1}}  # skipped: no value

    def test_each_monitor_value_is_a_headline_chart_and_only_its_verdict_code_stays_in_the_stage(self) -> None:
        figures = run_figures({"monitors": self.MONITORS}, {"monitors": {"seconds": 0.2}}, {})
        assert figures == {"monitor/anomaly_rates": 0.4, "stage/monitors/anomaly_rates.verdict_code": 2.0,
                           "stage/monitors/grpo_health.verdict_code": -1.0, "timing/monitors": 0.2}
        assert _section("monitor/anomaly_rates") == "monitor"
