"""benchmarks/grpo_rounds.py: a grpo batch's groups by what their reward spread comes from, and the
on-policy rounds' pass rates per environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from grpo_rounds import group_composition, group_kind, measure, round_pass_rates  # noqa: E402


def reward(task: str, env: str, passed: bool, value: float) -> dict:
    return {"task_id": task, "env": env, "passed": passed, "reward": value}


def test_a_group_is_told_apart_by_its_verdicts_then_by_its_reward_spread():
    assert group_kind([reward("t", "code", True, 1.0), reward("t", "code", False, 0.3)]) == "mixed"
    assert group_kind([reward("t", "code", True, 1.0), reward("t", "code", True, 1.0)]) == "all_pass"
    # no sample passed, but partial credit differs: a spread the verdict never gave
    assert group_kind([reward("t", "code", False, 0.4), reward("t", "code", False, 0.1)]) == "all_fail_spread"
    assert group_kind([reward("t", "code", False, 0.2), reward("t", "code", False, 0.2)]) == "all_fail_flat"


def test_the_composition_counts_groups_per_environment_not_samples():
    rows = ([reward("a", "code", True, 1.0), reward("a", "code", False, 0.0)]
            + [reward("b", "code", False, 0.5), reward("b", "code", False, 0.0)]
            + [reward("c", "rules", False, 0.6), reward("c", "rules", False, 0.2)])
    counts = group_composition(rows)
    assert counts["code"] == {"mixed": 1, "all_fail_spread": 1, "all_fail_flat": 0, "all_pass": 0}
    assert counts["rules"]["all_fail_spread"] == 1 and sum(counts["rules"].values()) == 1


def test_round_pass_rates_are_per_round_and_environment():
    rows = [{"round": 2, "env": "code", "scored": {"passed": True}}, {"round": 2, "env": "code", "scored": {"passed": False}},
            {"round": 3, "env": "data", "scored": {"passed": True}}]
    assert round_pass_rates(rows) == {2: {"code": (0.5, 2)}, 3: {"data": (1.0, 1)}}


def test_a_workspace_without_rounds_is_refused_by_name(tmp_path):
    (tmp_path / "data/batch").mkdir(parents=True)
    (tmp_path / "data/batch/rewards.jsonl").write_text("")
    with pytest.raises(SystemExit, match="train_rounds.jsonl"):
        measure(tmp_path)
    (tmp_path / "data/batch/train_rounds.jsonl").write_text("")
    with pytest.raises(SystemExit, match="rounds was 1"):
        measure(tmp_path)
