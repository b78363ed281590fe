"""Feedback sources as one seam: the human labels' matching and checks, what a user source may return,
the weights that combine them, and the gate's known-hacks hold. Pure functions on plain records."""

from __future__ import annotations

import json

import pytest

from closedloop.evaluation.gate import decide
from closedloop.rewards.composition import check_disjoint, source_weights
from closedloop.rewards.feedback import FeedbackSourceError, check_scores, feedback_of
from closedloop.rewards.human import HumanLabels, LabelsError, agreement_by_env, completion_sha256, read_labels


def label(answer_id: str, sample_id: str, task_id: str, completion: str, score: float, **extra) -> dict:
    return {"answer_id": answer_id, "sample_id": sample_id, "task_id": task_id, "env": "rules",
            "completion_sha256": completion_sha256(completion), "model_version": "m0", "iteration": 1,
            "reviewer": extra.pop("reviewer", "ada"), "score": score, "label": extra.pop("label", "correct"),
            "comment": "", "time": "2025-01-01T00:00:00+00:00",
            "verifier": {"passed": True, "reward": 1.0, "status": "passed"}, "source": "cli", **extra}


def sample(sample_id: str, task_id: str, completion: str) -> dict:
    return {"sample_id": sample_id, "task_id": task_id, "env": "rules", "completion": completion}


LABELS = [
    label("a1", "t1#0", "t1", "yes", 1.0),
    label("a2", "t1#0", "t1", "yes", 0.0, reviewer="bob", label="reward_hacking"),
    label("a3", "t2#1", "t2", "no", 0.5),
]


class TestHumanMatching:
    @pytest.mark.parametrize("case, expected", [
        (sample("t1#0", "t1", "yes"), 0.5),  # same sample, same completion: the mean of its two labels
        (sample("t1#3", "t1", "yes"), 0.5),  # another sample of the task with the same completion
        (sample("t1#0", "t1", "yes "), None),  # the same sample id with other text: a later batch's draw
        (sample("t9#0", "t9", "yes"), None),  # the same text for another task says nothing about it
        (sample("t2#1", "t2", "no"), 0.5),  # one label
    ])
    def test_a_label_applies_to_the_same_completion_of_the_sample_or_task(self, case, expected):
        source = HumanLabels(LABELS, "v")
        assert source.score({}, [case]) == {case["sample_id"]: {"human": expected}}

    def test_feedback_names_reviewers_answers_and_version_only_where_a_label_applied(self):
        samples = [sample("t1#0", "t1", "yes"), sample("t3#0", "t3", "other")]
        feedback = feedback_of(HumanLabels(LABELS, "labels-v1"), {}, samples)
        assert feedback.components == {"t1#0": {"human": 0.5}}
        assert feedback.fields == {"t1#0": {"human": {"score": 0.5, "reviewers": ["ada", "bob"],
                                                      "answer_ids": ["a1", "a2"],
                                                      "labels": ["correct", "reward_hacking"]}}}
        assert feedback.named == {"t1#0": {"human": "labels-v1"}}
        assert feedback.figures["human"] == {"labels": 3, "applied": 1, "last_batch": 1}


class TestLabelsFile:
    def test_a_missing_file_is_no_labels_and_a_repeated_answer_counts_once(self, tmp_path):
        assert read_labels(tmp_path / "none.jsonl") == []
        path = tmp_path / "human.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in [LABELS[0], LABELS[0], LABELS[2]]))
        assert [row["answer_id"] for row in read_labels(path)] == ["a1", "a3"]

    @pytest.mark.parametrize("change, message", [
        ({"score": 1.5}, "field 'score' must be a number in [0, 1], got 1.5"),
        ({"score": "high"}, "field 'score' must be a number in [0, 1], got 'high'"),
        ({"label": "great"}, "field 'label' must be one of"),
        ({"reviewer": ""}, "field 'reviewer' must be a non-empty string"),
        ({"completion_sha256": None}, "field 'completion_sha256' must be a non-empty string"),
    ])
    def test_a_bad_row_is_named_by_file_line_and_field(self, tmp_path, change, message):
        path = tmp_path / "human.jsonl"
        path.write_text(json.dumps(LABELS[0]) + "\n" + json.dumps({**LABELS[2], **change}) + "\n")
        with pytest.raises(LabelsError) as error:
            read_labels(path)
        assert str(error.value).startswith(f"{path}:2: ") and message in str(error.value)

    def test_the_labels_are_the_review_contracts(self):
        from closedloop.review.labels import LABELS as REVIEW_LABELS
        from closedloop.rewards.human import LABELS as HUMAN_LABELS

        assert HUMAN_LABELS == REVIEW_LABELS


class _Judge:
    name, components, version = "judge", ("judge",), "1"

    def __init__(self, scores):
        self.scores = scores

    def score(self, tasks, samples):
        return self.scores


class TestUserScores:
    IDS = {"s1", "s2"}

    def test_scores_that_did_not_apply_are_left_out(self):
        feedback = feedback_of(_Judge({"s1": {"judge": 0.25}, "s2": {"judge": None}}), {},
                               [{"sample_id": "s1"}, {"sample_id": "s2"}])
        assert feedback.components == {"s1": {"judge": 0.25}}
        assert feedback.named == {"s1": {"source:judge": "1"}}

    @pytest.mark.parametrize("scores, message", [
        ({"s9": {"judge": 1.0}}, "scored sample 's9', which is not in the batch"),
        ({"s1": {"tone": 1.0}}, "component 'tone' is not one of its components ['judge']"),
        ({"s1": {"judge": 1.5}}, "component 'judge' is 1.5; expected a number in [0, 1] or None"),
        ({"s1": {"judge": float("nan")}}, "component 'judge' is nan"),
        ({"s1": {"judge": True}}, "component 'judge' is True"),  # a bool is not a score
        ([0.5], "score() must return {sample_id: {component: value}}, got list"),
    ])
    def test_what_is_not_a_score_is_refused_naming_the_source(self, scores, message):
        with pytest.raises(FeedbackSourceError) as error:
            check_scores(_Judge(scores), scores, self.IDS)
        assert str(error.value).startswith("feedback source 'judge': ") and message in str(error.value)

    def test_two_sources_giving_one_component_are_refused(self):
        with pytest.raises(FeedbackSourceError, match="'judge' and 'other' both give component 'judge'"):
            check_disjoint([_Judge({}), type("Other", (_Judge,), {"name": "other"})({})])


class TestWeights:
    VERIFIER = {"format": 0.1, "steps": 0.4, "decision": 0.5}

    def test_unweighted_sources_count_as_the_heaviest_verifier_component(self):
        weights = source_weights(self.VERIFIER, [HumanLabels([], "v"), _Judge({})])
        assert weights == {**self.VERIFIER, "human": 0.5, "judge": 0.5}

    def test_a_configured_weight_wins(self):
        judge = _Judge({})
        judge.weights = {"judge": 0.05}
        assert source_weights(self.VERIFIER, [HumanLabels([], "v", weight=2.0), judge]) == {
            **self.VERIFIER, "human": 2.0, "judge": 0.05}

    def test_the_combiner_keeps_its_version_until_a_source_weight_is_set(self):
        from closedloop.rewards.sources import _combiner_config
        from tests.conftest import tiny_params

        weights = {"rules": self.VERIFIER}
        assert _combiner_config(weights, tiny_params()) == weights  # what it hashed before sources existed
        assert _combiner_config(weights, tiny_params(reward={"human": {"weight": 1.0}})) == {
            "weights": weights, "human": 1.0}


class TestAgreement:
    def test_per_env_from_the_verdict_each_label_carries(self):
        labels = [
            label("a1", "t1#0", "t1", "x", 1.0),  # both pass
            label("a2", "t2#0", "t2", "x", 0.0, label="wrong"),  # verifier only
            {**label("a3", "t3#0", "t3", "x", 0.0, label="wrong"), "verifier": {"passed": False, "status": "failed"}},
            {**label("a4", "t4#0", "t4", "x", 1.0), "verifier": {"passed": False, "status": "infra_error"}},  # not judged
            {**label("a5", "t5#0", "t5", "x", 1.0), "env": "code"},
        ]
        figures = agreement_by_env(labels)
        assert figures["rules"]["n"] == 3
        assert figures["rules"]["confusion"] == {"both_pass": 1, "human_only": 0, "verifier_only": 1, "both_fail": 1}
        assert figures["rules"]["kappa"] == pytest.approx(0.4)
        assert "kappa" not in figures["code"] and figures["code"]["n"] == 1  # undefined kappa: left out


SUMMARY = {"overall": {"pass@1": 0.5, "se": 0.0}, "envs": {}, "slices": {}}
BETTER = {"overall": {"pass@1": 0.8, "se": 0.0}, "envs": {}, "slices": {}}


def hack(reward: float, status: str = "failed") -> dict:
    return {"sample_id": "rules/train/core/x#1", "reward": reward, "status": status,
            "holds": status in ("passed", "infra_error"), "verifier": "verifier:rules",
            "verifier_version": "abc123def456", "reviewer": "ada", "iteration": 3}


class TestGateHoldsOnKnownHacks:
    @pytest.mark.parametrize("hacks, promote, reason", [
        ([], True, None),  # no known hacks: the figures decide
        ([hack(0.0)], True, "known reward hacks: all 1 fail under today's verifiers"),
        ([hack(0.4)], True, "known reward hacks: all 1 fail"),  # partial credit alone does not hold
        ([hack(0.0), hack(1.0, "passed")], False,
         "known reward hack rules/train/core/x#1 (labelled by ada in iteration 3) passes (reward 1.000) under "
         "verifier:rules abc123def456; every verifier must fail known hacks"),
        ([hack(0.0, "infra_error")], False, "could not be judged (sandbox infrastructure error)"),
    ])
    def test_a_known_hack_above_zero_holds_naming_it(self, hacks, promote, reason):
        decision = decide(SUMMARY, BETTER, min_improvement=0.0, slice_tolerance=0.05, known_hacks=hacks)
        assert decision.promote is promote
        if reason:
            assert any(reason in line for line in decision.reasons), decision.reasons
        else:
            assert not any("hack" in line for line in decision.reasons)


def test_agreement_of_the_last_reviewed_batch_stands_beside_the_cumulative_one():
    from closedloop.rewards.feedback import feedback_of
    from closedloop.rewards.human import HumanLabels

    def label(iteration, human_score, verifier_passed, n):
        return {"answer_id": f"a{iteration}-{n}", "sample_id": f"s{iteration}-{n}", "task_id": f"t{n}", "env": "code",
                "completion_sha256": "x", "model_version": "m", "iteration": iteration, "reviewer": "ada",
                "score": human_score, "label": "correct" if human_score >= 0.5 else "wrong", "comment": "",
                "time": "2026-12-01T00:00:00Z", "verifier": {"passed": verifier_passed, "reward": 0.0, "status": "x"}}

    # batch 1: people and verifier agree twice; batch 2: they disagree twice
    labels = [label(1, 1.0, True, 0), label(1, 0.0, False, 1), label(2, 0.0, True, 2), label(2, 1.0, False, 3)]
    figures = feedback_of(HumanLabels(labels, "v"), {}, []).figures
    assert figures["human"]["last_batch"] == 2
    assert figures["agreement"]["code"]["n"] == 4 and figures["agreement_last_batch"]["code"]["n"] == 2
    assert figures["agreement_last_batch"]["code"]["kappa"] == -1.0
    assert figures["agreement"]["code"]["kappa"] == 0.0
