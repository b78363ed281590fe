"""Human review core: the stratified draw, answer validation and the inbox, merge_inbox, Cohen's kappa."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from closedloop.config import ReviewStrata
from closedloop.review import labels
from closedloop.review.agreement import agreement, cohen_kappa
from closedloop.review.form import review_markdown
from closedloop.review.sample import STRATA, draw, validators_disagree
from closedloop.workspace import Workspace

ENVS = ("code", "rules")


def batch(n_per_env: int = 12):
    """Graded rows, reward rows and tasks of a made-up batch: buckets, rewards and components cycle so
    every stratum has candidates."""
    graded, rewards, tasks = [], {}, {}
    for env in ENVS:
        for i in range(n_per_env):
            task_id, sample_id = f"{env}/train/{i}", f"{env}/train/{i}#0"
            bucket, reward, passed, components = [
                ("positive", 1.0, True, {"a": 1.0, "b": 1.0}),
                ("partial", 0.5, False, {"a": 1.0, "b": 0.0}),      # partial, disagree, near 0.5
                ("partial", 0.25, False, {"a": 0.5, "b": 0.0}),     # partial credit only
                ("error", 0.0, False, {"a": 0.0, "b": None}),
            ][i % 4]
            tasks[task_id] = {"task_id": task_id, "env": env, "prompt": f"prompt {i}", "checks": {}, "reference": ""}
            graded.append({"sample_id": sample_id, "task_id": task_id, "env": env, "slice": "core", "bucket": bucket,
                           "reward": reward, "completion": f"answer {i}", "model_version": "abc", "status": "x"})
            rewards[sample_id] = {"sample_id": sample_id, "reward": reward, "passed": passed, "status": "x",
                                  "components": components, "steps": {"format": True}, "feedback": ""}
    return graded, rewards, tasks


def strata(**values):
    return ReviewStrata(**{"per_env_bucket": 1, "partial_failed": 1, "validators_disagree": 1, "near_threshold": 1,
                           **values})


class TestDraw:
    def test_each_env_bucket_then_each_disagreement(self):
        rows = draw(*batch(), strata(), size=100, seed=1, iteration=3)
        drawn = [(r["env"], r["bucket"]) for r in rows if r["stratum"] == "env_bucket"]
        assert sorted(drawn) == sorted((env, b) for env in ENVS for b in ("positive", "partial", "error"))
        assert [r["stratum"] for r in rows].count("partial_failed") == 1
        assert {r["stratum"] for r in rows} == set(STRATA)
        assert all(r["iteration"] == 3 and r["task"]["prompt"] == r["prompt"] for r in rows)

    def test_size_caps_the_sample_strata_first(self):
        rows = draw(*batch(), strata(per_env_bucket=2), size=5, seed=1, iteration=1)
        assert len(rows) == 5 and {r["stratum"] for r in rows} == {"env_bucket"}

    def test_no_sample_twice_even_when_strata_overlap(self):
        rows = draw(*batch(2), strata(per_env_bucket=5, partial_failed=5, validators_disagree=5, near_threshold=5),
                    size=100, seed=1, iteration=1)
        ids = [r["sample_id"] for r in rows]
        assert len(ids) == len(set(ids)) == 4  # only 4 samples exist

    def test_deterministic_and_independent_of_input_order(self):
        graded, rewards, tasks = batch()
        first = draw(graded, rewards, tasks, strata(), size=8, seed=5, iteration=1)
        again = draw(list(reversed(graded)), rewards, tasks, strata(), size=8, seed=5, iteration=1)
        other = draw(graded, rewards, tasks, strata(), size=8, seed=6, iteration=1)
        assert first == again
        assert [r["sample_id"] for r in first] != [r["sample_id"] for r in other]

    @pytest.mark.parametrize("components, expected", [
        ({"format": 1.0, "tests": 0.0}, True),  # well-formed, wrong: the typical disagreement
        ({"format": 1.0, "tests": 0.5}, False),  # graded credit is no contradiction
        ({"format": 1.0, "tests": None}, False),  # a component that did not apply says nothing
        ({"format": 0.0}, False),
    ])
    def test_validators_disagree(self, components, expected):
        assert validators_disagree(components) is expected

    def test_markdown_shows_prompt_completion_verdict_and_steps(self):
        rows = draw(*batch(), strata(), size=2, seed=1, iteration=1)
        text = review_markdown(rows)
        assert rows[0]["prompt"] in text and rows[0]["completion"] in text
        assert "step signals: format=true" in text and "reward" in text


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return Workspace.at(tmp_path)


@pytest.fixture
def review():
    rows = draw(*batch(), strata(), size=6, seed=1, iteration=2)
    return rows


def answer(sample_id, score=1.0, label="correct", comment=""):
    return {"sample_id": sample_id, "score": score, "label": label, "comment": comment}


class TestAnswers:
    @pytest.mark.parametrize("change, field", [
        ({"score": 1.5}, "answers[1].score (sample {id})"),  # out of range, named with its sample
        ({"score": float("nan")}, "answers[1].score"),
        ({"label": "great"}, "answers[1].label"),
        ({"sample_id": "code/train/nope#0"}, "answers[1].sample_id: 'code/train/nope#0' is not in the review sample"),
        ({"extra": 1}, "answers[1].extra"),
    ])
    def test_bad_answer_names_the_field_and_writes_nothing(self, ws, review, change, field):
        labels.append_to_inbox(ws, [{"answer_id": "earlier"}])
        before = labels.inbox_path(ws).read_bytes()
        data = {"reviewer": "ann", "answers": [answer(review[0]["sample_id"]), {**answer(review[1]["sample_id"]), **change}]}
        with pytest.raises(labels.AnswerError) as error:
            labels.submit(ws, data, review, "api")
        assert field.format(id=review[1]["sample_id"]) in str(error.value)
        assert labels.inbox_path(ws).read_bytes() == before  # the good first answer was not written either

    @pytest.mark.parametrize("data, field", [
        ({"reviewer": " ", "answers": [{}]}, "reviewer"),
        ({"answers": []}, "answers"),
    ])
    def test_reviewer_and_answers_required(self, ws, review, data, field):
        with pytest.raises(labels.AnswerError, match=field):
            labels.submit(ws, data, review, "api")
        assert not labels.inbox_path(ws).exists() or labels.inbox_path(ws).read_bytes() == b""

    def test_the_same_sample_twice_is_refused(self, ws, review):
        sid = review[0]["sample_id"]
        with pytest.raises(labels.AnswerError, match=r"answers\[1\].sample_id: .* answered twice"):
            labels.submit(ws, {"reviewer": "ann", "answers": [answer(sid), answer(sid)]}, review, "api")

    def test_rows_follow_the_contract(self, ws, review):
        sid = review[0]["sample_id"]
        rows = labels.submit(ws, {"reviewer": "ann", "answers": [answer(sid, 0.25, "wrong", "off by one")]}, review, "cli")
        (row,) = [json.loads(line) for line in labels.inbox_path(ws).read_text().splitlines()]
        assert row == rows[0]
        assert {k: row[k] for k in ("sample_id", "reviewer", "score", "label", "comment", "source", "iteration")} == \
            {"sample_id": sid, "reviewer": "ann", "score": 0.25, "label": "wrong", "comment": "off by one",
             "source": "cli", "iteration": 2}
        assert row["completion_sha256"] == review[0]["completion_sha256"] and len(row["answer_id"]) == 32
        assert set(row["verifier"]) == {"passed", "reward", "status"} and row["time"].endswith("Z")
        assert "/inbox.jsonl" in (ws.root / "data/labels/.gitignore").read_text().splitlines()

    def test_concurrent_appends_lose_nothing(self, ws, review):
        code = ("import sys; from closedloop.review import labels; from closedloop.workspace import Workspace\n"
                "ws = Workspace.at(sys.argv[1])\n"
                "for i in range(40): labels.append_to_inbox(ws, [{'answer_id': f'{sys.argv[2]}-{i}', 'pad': 'x' * 5000}])\n")
        root = Path(__file__).resolve().parents[2]
        procs = [subprocess.Popen([sys.executable, "-c", code, str(ws.root), name], cwd=root) for name in "ab"]
        assert [p.wait() for p in procs] == [0, 0]
        ids = [json.loads(line)["answer_id"] for line in labels.inbox_path(ws).read_text().splitlines()]
        assert sorted(ids) == sorted(f"{n}-{i}" for n in "ab" for i in range(40))


class TestMerge:
    def submit(self, ws, review, *answers, reviewer="ann"):
        return labels.submit(ws, {"reviewer": reviewer, "answers": list(answers)}, review, "api")

    def test_moves_answers_and_hacks_then_empties_the_inbox(self, ws, review):
        self.submit(ws, review, answer(review[0]["sample_id"]), answer(review[1]["sample_id"], 0, "reward_hacking", "edits the tests"))
        self.submit(ws, review, answer(review[2]["sample_id"], 0.5, "other"), reviewer="bo")
        counts = labels.merge_inbox(ws)
        assert {k: counts[k] for k in ("merged", "duplicates", "known_hacks", "torn", "labels")} == \
            {"merged": 3, "duplicates": 0, "known_hacks": 1, "torn": 0, "labels": 3}
        human = [json.loads(line) for line in ws.human_labels.read_text().splitlines()]
        assert [row["reviewer"] for row in human] == ["ann", "ann", "bo"] and all("sample" not in row for row in human)
        (hack,) = [json.loads(line) for line in ws.known_hacks.read_text().splitlines()]
        assert hack["task"] == review[1]["task"] and hack["completion"] == review[1]["completion"]
        assert hack["comment"] == "edits the tests" and hack["answer_id"] == human[1]["answer_id"]
        assert labels.inbox_path(ws).read_text() == ""
        assert labels.merge_inbox(ws)["merged"] == 0  # nothing new: the files stay as they are

    def test_a_merge_killed_before_emptying_the_inbox_adds_nothing_twice(self, ws, review):
        self.submit(ws, review, answer(review[0]["sample_id"], 0, "reward_hacking"))
        queued = labels.inbox_path(ws).read_bytes()
        labels.merge_inbox(ws)
        labels.inbox_path(ws).write_bytes(queued)  # as if killed after writing the targets
        self.submit(ws, review, answer(review[1]["sample_id"]))
        counts = labels.merge_inbox(ws)
        assert (counts["merged"], counts["duplicates"], counts["known_hacks"]) == (1, 1, 0)
        assert len(ws.human_labels.read_text().splitlines()) == 2
        assert len(ws.known_hacks.read_text().splitlines()) == 1

    def test_killed_between_the_two_targets_still_records_the_hack(self, ws, review):
        self.submit(ws, review, answer(review[0]["sample_id"], 0, "reward_hacking"))
        queued = labels.inbox_path(ws).read_bytes()
        labels.merge_inbox(ws)
        ws.known_hacks.unlink()  # human.jsonl written, known_hacks.jsonl not yet
        labels.inbox_path(ws).write_bytes(queued)
        counts = labels.merge_inbox(ws)
        assert (counts["merged"], counts["known_hacks"]) == (0, 1)

    def test_a_torn_last_line_is_dropped_and_counted(self, ws, review):
        self.submit(ws, review, answer(review[0]["sample_id"]))
        with labels.inbox_path(ws).open("a") as handle:
            handle.write('{"answer_id": "cut sh')
        counts = labels.merge_inbox(ws)
        assert (counts["merged"], counts["torn"]) == (1, 1)

    def test_a_bad_line_in_the_middle_is_named(self, ws):
        labels.inbox_path(ws).parent.mkdir(parents=True)
        labels.inbox_path(ws).write_text('not json\n{"answer_id": "a"}\n')
        with pytest.raises(ValueError, match=r"inbox.jsonl:1: not valid JSON"):
            labels.merge_inbox(ws)


class TestKappa:
    """Parity with scikit-learn's cohen_kappa_score (the oracle) on known tables."""

    @pytest.mark.parametrize("a, b", [
        ([1, 1, 0, 0, 1, 0, 1, 1], [1, 0, 0, 0, 1, 1, 1, 1]),  # some agreement
        ([1, 0, 1, 0], [1, 0, 1, 0]),  # perfect agreement, both classes: 1.0
        ([1, 0, 1, 0], [0, 1, 0, 1]),  # perfect disagreement: -1.0
        ([1, 1, 1, 1], [1, 0, 1, 0]),  # one rater uses one class only: defined (0.0)
        ([1] * 20 + [0] * 5, [1] * 18 + [0] * 7),  # unbalanced
    ])
    def test_equals_sklearn(self, a, b):
        from sklearn.metrics import cohen_kappa_score

        assert cohen_kappa([bool(x) for x in a], [bool(x) for x in b]) == pytest.approx(cohen_kappa_score(a, b))

    @pytest.mark.parametrize("a, b", [([], []), ([True] * 3, [True] * 3), ([False] * 2, [False] * 2)])
    def test_undefined_is_none_where_sklearn_gives_nan(self, a, b):
        # both raters gave one and the same verdict throughout: chance agreement is 1, kappa 0/0
        assert cohen_kappa(a, b) is None

    def test_agreement_counts(self):
        pairs = [(True, True), (True, False), (False, True), (False, False), (True, True)]
        result = agreement(pairs)
        assert result["confusion"] == {"both_pass": 2, "human_only": 1, "verifier_only": 1, "both_fail": 1}
        assert result["n"] == 5 and result["kappa"] == pytest.approx(cohen_kappa(*map(list, zip(*pairs))))


def test_an_append_after_a_torn_write_drops_the_torn_line_and_keeps_the_inbox_readable(tmp_path):
    import json

    from closedloop.review.labels import append_to_inbox, inbox_path, queued_answers
    from closedloop.workspace import Workspace

    ws = Workspace.at(tmp_path)
    append_to_inbox(ws, [{"answer_id": "a1", "iteration": 1}])
    with inbox_path(ws).open("a", encoding="utf-8") as handle:
        handle.write('{"answer_id": "a2", "itera')  # a kill mid-write: no newline
    append_to_inbox(ws, [{"answer_id": "a3", "iteration": 1}])
    assert [row["answer_id"] for row in queued_answers(ws)] == ["a1", "a3"]
    assert all(json.loads(line) for line in inbox_path(ws).read_text().splitlines())


def test_a_resumed_iteration_merges_no_answers_and_a_recorded_labels_file_is_never_made_anew(tmp_path):
    import pytest

    from closedloop.config import Params
    from closedloop.io import read_json
    from closedloop.versioning.reviews import merge_reviews
    from closedloop.review.labels import append_to_inbox, queued_answers
    from closedloop.workspace import HUMAN_LABELS, Workspace

    ws = Workspace.at(tmp_path)
    params = Params.model_validate({"loop": {"iteration": 3}, "review": {"mode": "before_promotion"}})
    append_to_inbox(ws, [{"answer_id": "a1", "iteration": 3, "reviewer": "ada"}])
    assert merge_reviews(ws, params, resuming=True)["merged"] == 0
    assert [row["answer_id"] for row in queued_answers(ws)] == ["a1"]  # kept for this iteration's gate
    assert ws.human_labels.read_text() == "" and read_json(ws.review_outcome)["state"] == "pending"

    ws.human_labels.unlink()
    (tmp_path / f"{HUMAN_LABELS}.dvc").write_text("outs:\n- md5: 0\n")
    with pytest.raises(FileNotFoundError, match="dvc checkout data/labels/human.jsonl"):
        merge_reviews(ws, params, resuming=True)
    assert not ws.human_labels.exists()
