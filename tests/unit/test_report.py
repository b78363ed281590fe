"""The gate decision as people read it (closedloop/reports/gate_report.py): the version description
and the Markdown artifact, from gate.json as the gate stage writes it."""

from __future__ import annotations

import pytest

from closedloop.evaluation.gate import decide
from closedloop.reports.gate_report import (
    comparisons,
    decision_sentence,
    gate_markdown,
    pp,
    run_link,
    warm_start_sentence,
)

CHAMPION_FP = "1e5f9e2f84946a9c"
CANDIDATE_FP = "454c765c861cf5d1"
SETTINGS = {"min_improvement": 0.0, "slice_tolerance": 0.05, "noise_z": 0.0}


def _summary(envs: dict[str, float], slices: dict[str, float], fingerprint: str) -> dict:
    def figures(value):
        return {"pass@1": value, "se": 0.0, "tasks": 20}
    overall = sum(envs.values()) / len(envs)
    return {"model_version": fingerprint, "overall": figures(overall),
            "envs": {k: figures(v) for k, v in envs.items()}, "slices": {k: figures(v) for k, v in slices.items()}}


def _gate(champion: dict, candidate: dict, settings=SETTINGS, untrained: str | None = None) -> dict:
    """gate.json as stages/gate.py writes it, the decision made by the real gate."""
    decision = decide(champion, candidate, min_improvement=settings["min_improvement"],
                      slice_tolerance=settings["slice_tolerance"], noise_z=settings["noise_z"], untrained=untrained)
    return {**decision.to_dict(), "trained": untrained is None, "untrained_reason": untrained,
            "champion": champion, "candidate": candidate, "settings": settings}


SLICES = ("code/core", "code/edge", "data/core", "data/edge")
CHAMPION = _summary({"code": 0.30, "data": 0.40}, dict(zip(SLICES, (0.30, 0.30, 0.40, 0.40))), CHAMPION_FP)
BETTER = _summary({"code": 0.45, "data": 0.42}, dict(zip(SLICES, (0.50, 0.40, 0.44, 0.40))), CANDIDATE_FP)
# Better overall, but data/edge fell 10 points (beyond the 5-point tolerance).
EDGE_FELL = _summary({"code": 0.60, "data": 0.40}, dict(zip(SLICES, (0.60, 0.60, 0.50, 0.30))), CANDIDATE_FP)
WORSE = _summary({"code": 0.28, "data": 0.40}, dict(zip(SLICES, (0.28, 0.28, 0.40, 0.40))), CANDIDATE_FP)
SUMMARY = {"iteration": 4, "model_version": "5", "parent_version": "3", "run_id": "0a1b2c3d4e5f",
           "experiment_id": "7", "tracking_uri": "sqlite:////ws/mlflow.db",
           "experiment": "iter-004-454c765c", "exp_rev": "c0ffee0123456789abcdef"}


class TestDecisionSentence:
    def test_promoted(self) -> None:
        gate = _gate(CHAMPION, BETTER)
        assert gate["promote"]
        assert decision_sentence(gate, "3") == (
            "Promoted: benchmark pass@1 0.435 vs champion v3 0.350 (+8.5 pp); "
            "no environment or slice regressed beyond tolerance.")

    def test_held_by_a_slice_names_it_with_its_figures(self) -> None:
        gate = _gate(CHAMPION, EDGE_FELL)
        assert not gate["promote"]
        assert decision_sentence(gate, "3") == (
            "Held: data/edge fell 0.400 \u2192 0.300 (\u221210.0 pp), beyond its slice tolerance 5.0 pp; "
            "benchmark pass@1 0.500 vs champion v3 0.350 (+15.0 pp).")

    def test_held_without_improvement(self) -> None:
        sentence = decision_sentence(_gate(CHAMPION, WORSE), "3")
        assert sentence.startswith("Held: benchmark pass@1 0.340 vs champion v3 0.350 (\u22121.0 pp) does not exceed")
        assert "code/core fell" not in sentence  # 2 points is within the tolerance

    def test_untrained(self) -> None:
        sentence = decision_sentence(_gate(CHAMPION, CHAMPION, untrained="no training examples"), "3")
        assert sentence.startswith("Held: the candidate was not trained (no training examples)") and "v3" in sentence

    def test_unknown_champion_version_is_said_so_not_a_fingerprint(self) -> None:
        sentence = decision_sentence(_gate(CHAMPION, BETTER), None)
        assert "the champion" in sentence and CHAMPION_FP not in sentence

    def test_warm_start(self) -> None:
        assert warm_start_sentence(CHAMPION) == (
            "Warm start (iteration 0), the first champion: benchmark pass@1 0.350 (code 0.300, data 0.400).")


class TestComparisons:
    @pytest.mark.parametrize("candidate", [BETTER, EDGE_FELL, WORSE], ids=["better", "edge-fell", "worse"])
    def test_regressions_are_the_gates(self, candidate) -> None:
        """The report's verdicts restate the gate's rule: the same groups regressed as the gate said."""
        gate = _gate(CHAMPION, candidate)
        regressed = {row["name"] for row in comparisons(gate) if row["verdict"] == "regressed"}
        said = {reason.split(" ", 2)[1] for reason in gate["reasons"] if " regressed " in reason}
        assert regressed == said

    def test_noise_widens_the_tolerance(self) -> None:
        noisy = {name: {**figures, "se": 0.1} for name, figures in EDGE_FELL["slices"].items()}
        settings = {**SETTINGS, "noise_z": 2.0}
        gate = _gate(CHAMPION, {**EDGE_FELL, "slices": noisy}, settings)
        row = next(r for r in comparisons(gate) if r["name"] == "data/edge")
        assert row["verdict"] == "within" and row["why"] == "2 standard errors (20.0 pp)"  # 2 * hypot(0, 0.1)
        assert gate["promote"]  # and the gate agrees

    def test_a_group_the_candidate_lacks_is_missing(self) -> None:
        lacking = {**BETTER, "slices": {k: v for k, v in BETTER["slices"].items() if k != "code/edge"}}
        gate = _gate(CHAMPION, lacking)
        assert [r["verdict"] for r in comparisons(gate) if r["name"] == "code/edge"] == ["missing"]
        assert "code/edge is missing from the candidate's evaluation" in decision_sentence(gate, "3")


class TestConfirmedGroups:
    """A group the evaluate stage measured again shows the figures the gate decided it on."""

    def gate(self, champion, candidate):
        confirmation = {"samples_per_task": 16, "groups": {"slice data/edge": {
            "champion": {"pass@1": champion, "se": 0.0, "tasks": 20},
            "candidate": {"pass@1": candidate, "se": 0.0, "tasks": 20}}}}
        settings = {**SETTINGS, "confirm_samples": 16}
        decision = decide(CHAMPION, EDGE_FELL, min_improvement=0.0, slice_tolerance=0.05, noise_z=0.0,
                          confirmation=confirmation)
        return {**decision.to_dict(), "trained": True, "untrained_reason": None, "champion": CHAMPION,
                "candidate": EDGE_FELL, "settings": settings, "confirmation": confirmation}

    def test_a_drop_that_did_not_show_again(self) -> None:
        gate = self.gate(0.40, 0.39)
        row = next(r for r in comparisons(gate) if r["name"] == "data/edge")
        assert (row["champion"], row["candidate"], row["verdict"]) == (0.40, 0.39, "within")
        assert row["why"] == "slice tolerance 5.0 pp; measured again at 16 samples per task after \u221210.0 pp at first"
        assert gate["promote"] and decision_sentence(gate, "3").startswith("Promoted:")
        text = gate_markdown(gate, {**SUMMARY, "promoted": True})
        assert "one that falls further is measured again, both models, at 16 samples per task" in text

    def test_a_drop_that_showed_again(self) -> None:
        gate = self.gate(0.40, 0.20)
        row = next(r for r in comparisons(gate) if r["name"] == "data/edge")
        assert row["verdict"] == "regressed" and not gate["promote"]
        assert "data/edge fell 0.400 \u2192 0.200 (\u221220.0 pp)" in decision_sentence(gate, "3")


class TestGateMarkdown:
    @pytest.mark.parametrize("candidate, promoted", [(BETTER, True), (EDGE_FELL, False)], ids=["promote", "hold"])
    def test_versions_not_fingerprints(self, candidate, promoted) -> None:
        gate = _gate(CHAMPION, candidate)
        text = gate_markdown(gate, {**SUMMARY, "promoted": promoted})
        assert text.startswith(f"# Iteration 4: candidate v5 {'promoted' if promoted else 'held'}\n")
        assert decision_sentence(gate, "3") in text
        assert "| environment | champion v3 | candidate v5 |" in text and "| slice | champion v3 | candidate v5 |" in text
        assert CHAMPION_FP not in text and CANDIDATE_FP not in text
        assert CHAMPION_FP[:8] not in text and CANDIDATE_FP[:8] not in text.replace(SUMMARY["experiment"], "")

    def test_episodes_show_each_round_beside_the_one_the_gate_decided_on(self) -> None:
        rounds = {"champion": {"pass@1": [0.2, 0.25, 0.3], "correction_rate": 0.125},
                  "candidate": {"pass@1": [0.3, 0.4, 0.45], "correction_rate": 0.2142}}
        text = gate_markdown({**_gate(CHAMPION, BETTER), "rounds": rounds}, {**SUMMARY, "promoted": True})
        assert "## Rounds" in text and "the gate decided on round 3" in text
        assert "| 1 | 0.200 | 0.300 |" in text and "| 3 | 0.300 | 0.450 |" in text
        assert "| failed first attempts fixed later | 0.125 | 0.214 |" in text
        assert "## Rounds" not in gate_markdown(_gate(CHAMPION, BETTER), {**SUMMARY, "promoted": True})

    def test_tables_rows_and_verdicts(self) -> None:
        text = gate_markdown(_gate(CHAMPION, EDGE_FELL), {**SUMMARY, "promoted": False})
        assert "| data/edge | 0.400 | 0.300 | \u221210.0 pp | slice tolerance 5.0 pp | **regressed** |" in text
        assert "| code | 0.300 | 0.600 | +30.0 pp | slice tolerance 5.0 pp | within tolerance |" in text
        # every environment and slice has its row
        assert all(f"| {name} |" in text for name in ("code", "data", *SLICES))

    def test_run_link_and_data_versions(self) -> None:
        text = gate_markdown(_gate(CHAMPION, BETTER), {**SUMMARY, "promoted": True})
        assert "`mlflow ui --backend-store-uri sqlite:////ws/mlflow.db`" in text and "`0a1b2c3d4e5f`" in text
        assert "DVC experiment `iter-004-454c765c` (commit `c0ffee012345`)" in text
        assert "dvc exp apply iter-004-454c765c" in text

    def test_not_registered_candidate(self) -> None:
        gate = _gate(CHAMPION, CHAMPION, untrained="it trained 0 steps")
        text = gate_markdown(gate, {**SUMMARY, "model_version": None, "promoted": False, "exp_rev": ""})
        assert "candidate (not registered)" in text and "Not saved as a DVC experiment" in text

    def test_other_reasons_are_shown_as_the_gate_wrote_them(self) -> None:
        gate = _gate(CHAMPION, BETTER)
        gate["reasons"].append("review: no human scores came within 600 s")
        assert "- review: no human scores came within 600 s" in gate_markdown(gate, {**SUMMARY, "promoted": True})


class TestRunLink:
    @pytest.mark.parametrize("uri, expected", [
        # a tracking server: a link into its UI
        ("http://127.0.0.1:5000", "[MLflow run `r1`](http://127.0.0.1:5000/#/experiments/7/runs/r1)"),
        ("https://mlflow.example.org/base/", "[MLflow run `r1`](https://mlflow.example.org/base/#/experiments/7/runs/r1)"),
        # credentials in the URI stay out of the page
        ("https://me:secret@mlflow.example.org", "[MLflow run `r1`](https://mlflow.example.org/#/experiments/7/runs/r1)"),
    ])
    def test_server(self, uri, expected) -> None:
        assert run_link(uri, "7", "r1") == expected

    def test_sqlite_names_the_run_and_the_command(self) -> None:
        text = run_link("sqlite:////ws/mlflow.db", "7", "r1")
        assert "`r1`" in text and "`mlflow ui --backend-store-uri sqlite:////ws/mlflow.db`" in text
        assert "/#/experiments/7/runs/r1" in text


@pytest.mark.parametrize("delta, text", [(0.084, "+8.4 pp"), (-0.1, "\u221210.0 pp"), (0.0, "+0.0 pp"),
                                         (-0.00001, "+0.0 pp")])  # a rounding zero is not negative
def test_pp(delta, text) -> None:
    assert pp(delta) == text


def test_a_champion_without_a_registry_version_is_named_once() -> None:
    sentence = decision_sentence(_gate(CHAMPION, BETTER), None)
    assert " vs the champion 0." in sentence and "champion the champion" not in sentence
