"""pass@k, benchmark summaries, and the promotion gate."""

import pytest

from closedloop.evaluation.gate import decide, regressed_groups
from closedloop.evaluation.stats import pass_at_k, summarize


class TestPassAtK:
    @pytest.mark.parametrize(
        "n, c, k, expected",
        [
            (4, 0, 1, 0.0),
            (4, 4, 1, 1.0),
            (4, 1, 1, 0.25),  # pass@1 is the passing fraction
            (5, 2, 2, 1 - (3 / 5) * (2 / 4)),  # the unbiased estimator of Chen et al.
            (3, 2, 2, 1.0),  # fewer failures than k: certain
        ],
    )
    def test_table(self, n, c, k, expected):
        assert pass_at_k(n, c, k) == pytest.approx(expected)


def summary(overall, slices):
    return {"overall": {"pass@1": overall, "se": 0.0, "tasks": 10},
            "slices": {name: {"pass@1": value, "se": 0.0, "tasks": 5} for name, value in slices.items()}}


class TestSummarize:
    def test_per_slice_means_weigh_tasks_equally(self):
        result = summarize([
            {"task_id": "a", "env": "code", "slice": "core", "n": 4, "c": 4},
            {"task_id": "b", "env": "code", "slice": "core", "n": 4, "c": 0},
            {"task_id": "c", "env": "code", "slice": "edge", "n": 2, "c": 1},
        ])
        assert result["overall"]["pass@1"] == pytest.approx(0.5)
        assert result["slices"]["code/core"]["pass@1"] == pytest.approx(0.5)
        assert result["slices"]["code/edge"] == {"pass@1": 0.5, "se": 0.0, "tasks": 1}
        assert result["envs"]["code"]["pass@1"] == pytest.approx(0.5) and result["envs"]["code"]["tasks"] == 3


class TestDecide:
    @pytest.mark.parametrize(
        "champion, candidate, promote, says",
        [
            (summary(0.2, {"code/core": 0.2}), summary(0.3, {"code/core": 0.3}), True, "+0.100"),
            (summary(0.3, {"code/core": 0.3}), summary(0.3, {"code/core": 0.3}), False, "does not exceed"),
            # better overall, but one slice fell beyond the tolerance
            (summary(0.3, {"code/a": 0.5, "code/b": 0.1}), summary(0.35, {"code/a": 0.3, "code/b": 0.4}), False,
             "slice code/a regressed -0.200"),
            # a small slice drop within tolerance does not block
            (summary(0.3, {"code/a": 0.5, "code/b": 0.1}), summary(0.35, {"code/a": 0.48, "code/b": 0.22}), True,
             "within slice_tolerance"),
            (summary(0.3, {"code/a": 0.3}), summary(0.4, {}), False, "missing"),
        ],
    )
    def test_table(self, champion, candidate, promote, says):
        decision = decide(champion, candidate, min_improvement=0.0, slice_tolerance=0.05)
        assert decision.promote is promote
        assert any(says in reason for reason in decision.reasons), decision.reasons

    def test_min_improvement(self):
        decision = decide(summary(0.30, {}), summary(0.32, {}), min_improvement=0.05, slice_tolerance=0.05)
        assert not decision.promote

    def test_an_environment_that_regressed_blocks(self):
        champion = {**summary(0.3, {"code/core": 0.3}), "envs": {"code": {"pass@1": 0.3, "se": 0.0}, "rules": {"pass@1": 0.6, "se": 0.0}}}
        candidate = {**summary(0.4, {"code/core": 0.4}), "envs": {"code": {"pass@1": 0.5, "se": 0.0}, "rules": {"pass@1": 0.4, "se": 0.0}}}
        decision = decide(champion, candidate, min_improvement=0.0, slice_tolerance=0.05)
        assert not decision.promote and any(r.startswith("env rules regressed -0.200") for r in decision.reasons)

    def test_noise_widens_the_tolerance_only_by_the_standard_errors(self):
        def noisy(overall, value, se):
            return {"overall": {"pass@1": overall, "se": 0.0}, "slices": {"code/edge": {"pass@1": value, "se": se}}}

        # -0.10 on a slice whose standard errors are 0.08 each: within 2 SE of the difference (0.226)
        decision = decide(noisy(0.3, 0.5, 0.08), noisy(0.4, 0.4, 0.08), min_improvement=0.0, slice_tolerance=0.05,
                          noise_z=2.0)
        assert decision.promote and any("within 2.0 standard errors (0.226)" in r for r in decision.reasons)
        # the same drop measured precisely is a regression
        decision = decide(noisy(0.3, 0.5, 0.01), noisy(0.4, 0.4, 0.01), min_improvement=0.0, slice_tolerance=0.05,
                          noise_z=2.0)
        assert not decision.promote and any("beyond slice_tolerance 0.05" in r for r in decision.reasons)


class TestConfirmation:
    """A group that regressed at the first evaluation is decided on its second measurement."""

    CHAMPION = {"overall": {"pass@1": 0.30, "se": 0.0}, "envs": {"rules": {"pass@1": 0.10, "se": 0.01}},
                "slices": {"rules/edge": {"pass@1": 0.075, "se": 0.02}, "code/core": {"pass@1": 0.5, "se": 0.02}}}
    CANDIDATE = {"overall": {"pass@1": 0.36, "se": 0.0}, "envs": {"rules": {"pass@1": 0.09, "se": 0.01}},
                 "slices": {"rules/edge": {"pass@1": 0.013, "se": 0.01}, "code/core": {"pass@1": 0.6, "se": 0.02}}}
    RULE = dict(min_improvement=0.0, slice_tolerance=0.05, noise_z=2.0)

    def again(self, champion, candidate, se=0.01):
        return {"samples_per_task": 16, "groups": {"slice rules/edge": {
            "champion": {"pass@1": champion, "se": se, "tasks": 20},
            "candidate": {"pass@1": candidate, "se": se, "tasks": 20}}}}

    def test_the_groups_measured_again_are_the_ones_the_gate_would_hold_for(self):
        assert regressed_groups(self.CHAMPION, self.CANDIDATE, slice_tolerance=0.05, noise_z=2.0) == ["slice rules/edge"]
        first = decide(self.CHAMPION, self.CANDIDATE, **self.RULE)
        assert not first.promote and any(r.startswith("slice rules/edge regressed -0.062") for r in first.reasons)
        assert regressed_groups(self.CHAMPION, self.CHAMPION, slice_tolerance=0.05, noise_z=2.0) == []

    def test_a_drop_that_does_not_show_again_promotes_and_both_measurements_are_said(self):
        decision = decide(self.CHAMPION, self.CANDIDATE, **self.RULE, confirmation=self.again(0.060, 0.055))
        assert decision.promote, decision.reasons
        said = next(r for r in decision.reasons if r.startswith("slice rules/edge"))
        assert said.startswith("slice rules/edge: -0.005 within slice_tolerance 0.05, measured again at 16 samples "
                               "per task after the first evaluation's -0.062 (0.013 vs 0.075) fell beyond")
        assert decision.slice_deltas["rules/edge"] == pytest.approx(-0.005)

    def test_a_drop_that_shows_again_holds(self):
        decision = decide(self.CHAMPION, self.CANDIDATE, **self.RULE, confirmation=self.again(0.150, 0.050))
        assert not decision.promote
        assert any(r.startswith("slice rules/edge regressed -0.100 (0.050 vs 0.150), beyond slice_tolerance 0.05, "
                                "measured again at 16") for r in decision.reasons), decision.reasons

    def test_the_second_measurement_has_the_same_noise_band(self):
        # -0.08 with standard errors of 0.04 each: within 2 SE of the difference (0.113) at the second look too
        decision = decide(self.CHAMPION, self.CANDIDATE, **self.RULE, confirmation=self.again(0.20, 0.12, se=0.04))
        assert decision.promote and any("-0.080 within 2.0 standard errors (0.113), measured again" in r
                                        for r in decision.reasons)


class TestHumanReviewBeforePromotion:
    BETTER = dict(min_improvement=0.0, slice_tolerance=0.05)

    def review(self, state, answers=()):
        return {"mode": "before_promotion", "state": state, "answers": list(answers),
                "reviewers": sorted({a["reviewer"] for a in answers})}

    def test_a_sample_marked_as_reward_hacking_holds_a_better_candidate(self):
        answers = [{"reviewer": "ada", "sample_id": "code/train/x#0", "label": "reward_hacking"},
                   {"reviewer": "bob", "sample_id": "code/train/y#1", "label": "correct"}]
        decision = decide(summary(0.4, {"a": 0.4}), summary(0.6, {"a": 0.6}), **self.BETTER,
                          review=self.review("answered", answers))
        assert not decision.promote
        assert any("ada marked sample code/train/x#0" in reason for reason in decision.reasons)

    def test_answers_without_hacks_and_a_timeout_are_said_and_decide_nothing(self):
        answers = [{"reviewer": "bob", "sample_id": "code/train/y#1", "label": "correct"}]
        for review, said in ((self.review("answered", answers), "1 answer(s) from bob"),
                             (self.review("timed_out"), "no human scores came (timed_out)")):
            decision = decide(summary(0.4, {"a": 0.4}), summary(0.6, {"a": 0.6}), **self.BETTER, review=review)
            assert decision.promote and any(said in reason for reason in decision.reasons)

    def test_an_async_review_is_not_the_gates_business(self):
        review = {**self.review("not_requested"), "mode": "async"}
        decision = decide(summary(0.4, {"a": 0.4}), summary(0.6, {"a": 0.6}), **self.BETTER, review=review)
        assert decision.promote and not any("human review" in reason for reason in decision.reasons)


def monitor(name, verdict="fail", value=0.4, fail=0.15, message="code: timeouts 40% of samples vs 0% before"):
    """One result as data/reports/monitors.json holds it (MonitorResult.to_dict)."""
    return {"name": name, "version": "1", "verdict": verdict, "value": value, "warn": 0.05, "fail": fail,
            "figures": {}, "message": message}


class TestMonitorsHoldPromotion:
    BETTER = dict(min_improvement=0.0, slice_tolerance=0.05)

    @pytest.mark.parametrize("holding, failing, promote", [
        ([monitor("anomaly_rates")], [], False),  # named in block_promotion: held, whatever the figures
        ([], [monitor("anomaly_rates")], True),  # failing but not blocking: said, decides nothing
        ([], [], True),  # no failing monitor: the figures decide
        ([monitor("anomaly_rates"), monitor("canary", value=1.0, fail=0.0, message="3 canary rewards changed")],
         [], False),  # each holding monitor is named
    ])
    def test_table(self, holding, failing, promote):
        decision = decide(summary(0.4, {"a": 0.4}), summary(0.6, {"a": 0.6}), **self.BETTER,
                          monitors_holding=holding, monitors_failing=failing)
        assert decision.promote is promote
        for result in holding:
            assert any(reason.startswith(f"monitor {result['name']} (version 1) failed: {result['message']}")
                       and reason.endswith("monitors.block_promotion holds the candidate")
                       for reason in decision.reasons), decision.reasons
        for result in failing:
            assert any(reason.startswith(f"monitor {result['name']} ") and "holds nothing" in reason
                       for reason in decision.reasons), decision.reasons

    def test_the_reason_gives_the_value_against_the_fail_threshold(self):
        decision = decide(summary(0.4, {"a": 0.4}), summary(0.6, {"a": 0.6}), **self.BETTER,
                          monitors_holding=[monitor("anomaly_rates")])
        assert "(value 0.400 > fail 0.15)" in decision.reasons[0]
