"""benchmarks/rules_lines.py: a rules answer scored line by line against its reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from rules_lines import answer_lines, score_lines  # noqa: E402

REFERENCE = "R1: no\nR2: yes\ndecision: deny\n"


def test_each_rule_line_and_the_decision_are_scored_apart():
    figures = score_lines([(REFERENCE, "R1: no\nR2: no\ndecision: deny\n"),  # one rule wrong, decision right
                           (REFERENCE, "R1: yes\nR2: yes\ndecision: approve\n")])  # one rule wrong, decision wrong
    assert figures["rule_lines_right"] == pytest.approx(2 / 4)
    assert figures["decisions_right"] == pytest.approx(1 / 2)
    assert figures["reference_yes_share"] == pytest.approx(2 / 4)
    assert figures["answer_yes_share"] == pytest.approx(2 / 4)


def test_a_missing_or_garbled_line_counts_as_wrong():
    figures = score_lines([(REFERENCE, "R1:no\nnonsense\n")])
    assert figures["rule_lines_right"] == pytest.approx(1 / 2) and figures["decisions_right"] == 0.0
    assert answer_lines("R1:  yes \nno colon here\ndecision: deny") == {"R1": "yes", "decision": "deny"}
