"""The reward stage composing its feedback sources on a tmp workspace (the rules environment only, a
handful of samples): human labels, a user's source from params.yaml, the known-hacks re-check, and
the gate that holds on a known hack today's verifier still passes."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import yaml

from closedloop.io import read_json, read_jsonl, write_json, write_jsonl
from closedloop.rewards.combine import combine
from closedloop.rewards.hacks import KNOWN_HACKS_CHECK
from closedloop.rewards.human import completion_sha256, labels_version
from closedloop.stages.common import StageError, run_stage
from closedloop.workspace import Workspace

# What a user writes in their own repository: any class with components, version and score().
USER_MODULE = textwrap.dedent('''
    class Brevity:
        """1 for a completion of at most max_chars characters, else 0."""

        components = ("brevity",)
        version = "1"

        def __init__(self, max_chars=40):
            self.max_chars = max_chars

        def score(self, tasks, samples):
            return {s["sample_id"]: {"brevity": float(len(s["completion"]) <= self.max_chars)} for s in samples}
''')


def rules_only(**reward) -> dict:
    from tests.conftest import TINY

    data = copy.deepcopy(TINY)
    for name in ("code", "data", "script", "extract"):  # no sandbox: the test stays quick
        data["envs"][name]["share"] = 0.0
    data["generate"]["n_tasks"] = 3
    data["reward"] = {**data["reward"], **reward}
    return data


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """Three rules tasks; per task its reference twice (#0, #1) and a wrong answer (#2)."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(rules_only()))
    run_stage("generate", root)
    ws = Workspace.at(root)
    samples = []
    for task in read_jsonl(ws.tasks):
        for index, completion in enumerate((task["reference"], task["reference"], "no idea\n")):
            samples.append({"sample_id": f"{task['task_id']}#{index}", "task_id": task["task_id"], "env": "rules",
                            "completion": completion, "model_version": "m0"})
    write_jsonl(ws.samples, samples)
    return ws


def rewards(ws: Workspace) -> dict[str, dict]:
    run_stage("reward", ws.root)
    return {row["sample_id"]: row for row in read_jsonl(ws.rewards)}


def label_of(sample: dict, score: float, reviewer: str, label: str) -> dict:
    return {"answer_id": f"{reviewer}-{sample['sample_id']}", "sample_id": sample["sample_id"],
            "task_id": sample["task_id"], "env": sample["env"], "completion_sha256": completion_sha256(sample["completion"]),
            "model_version": "m0", "iteration": 0, "reviewer": reviewer, "score": score, "label": label, "comment": "",
            "time": "2025-01-01T00:00:00+00:00", "verifier": {"passed": True, "reward": 1.0, "status": "passed"},
            "source": "cli"}


def only_numbers(data) -> bool:
    if isinstance(data, dict):
        return all(only_numbers(value) for value in data.values())
    return isinstance(data, (int, float))


def test_human_labels_apply_to_the_same_completion_and_leave_other_rows_as_they_were(ws):
    before = rewards(ws)
    samples = read_jsonl(ws.samples)
    first = samples[0]  # a reference: the verifier gives it full marks
    write_jsonl(ws.human_labels, [label_of(first, 0.0, "ada", "reward_hacking"),
                                  label_of(first, 0.5, "bob", "other")])
    after = rewards(ws)

    # the same completion: this sample by id, and its twin #1 by task and completion hash
    for sample_id in (first["sample_id"], samples[1]["sample_id"]):
        row = after[sample_id]
        assert row["components"]["human"] == 0.25
        assert row["human"] == {"score": 0.25, "reviewers": ["ada", "bob"],
                                "answer_ids": [f"ada-{first['sample_id']}", f"bob-{first['sample_id']}"],
                                "labels": ["other", "reward_hacking"]}
        assert row["feedback_sources"]["human"] == labels_version(ws.human_labels)
        # human weighs as the heaviest rules component (decision, 0.5)
        verifier_only = {k: v for k, v in row["components"].items() if k != "human"}
        expected = combine({**verifier_only, "human": 0.25}, {"format": 0.1, "steps": 0.4, "decision": 0.5, "human": 0.5})
        assert row["reward"] == pytest.approx(expected, abs=1e-6) and row["reward"] < before[sample_id]["reward"]
    untouched = set(before) - {first["sample_id"], samples[1]["sample_id"]}
    assert untouched and all(after[sid] == before[sid] for sid in untouched)  # byte for byte the same rows
    metrics = read_json(ws.metrics("reward"))
    assert metrics["human"] == {"labels": 2, "applied": 2, "last_batch": 0}
    assert metrics["agreement"]["rules"]["n"] == 2 and metrics["agreement_last_batch"]["rules"]["n"] == 2
    assert only_numbers(metrics)


def test_a_user_source_from_params_yaml_scores_through_the_real_stage(ws, tmp_path, monkeypatch):
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "user_sources.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    data = rules_only(sources={"brevity": {"entry": "user_sources:Brevity", "options": {"max_chars": 8},
                                           "weights": {"brevity": 0.25}}})
    (ws.root / "params.yaml").write_text(yaml.safe_dump(data))
    rows = rewards(ws)

    for sample in read_jsonl(ws.samples):
        row = rows[sample["sample_id"]]
        assert row["components"]["brevity"] == float(len(sample["completion"]) <= 8)  # its options reached it
        version = row["feedback_sources"]["source:brevity"]
        assert len(version) == 12
        verifier_only = {k: v for k, v in row["components"].items() if k != "brevity"}
        assert row["reward"] == pytest.approx(combine(row["components"], {"format": 0.1, "steps": 0.4, "decision": 0.5,
                                                                          "brevity": 0.25}), abs=1e-6)
        assert row["reward"] != pytest.approx(combine(verifier_only, {"format": 0.1, "steps": 0.4, "decision": 0.5}))
    info = read_json(ws.root / "metrics/info/reward.json")
    assert info["feedback_sources"]["source:brevity"] == version

    # a changed option is a new version in every row
    data["reward"]["sources"]["brevity"]["options"]["max_chars"] = 9
    (ws.root / "params.yaml").write_text(yaml.safe_dump(data))
    assert {row["feedback_sources"]["source:brevity"] for row in rewards(ws).values()} != {version}


@pytest.mark.parametrize("source, message", [
    ({"entry": "user_sources:Nope"}, "reward.sources.judge.entry: module 'user_sources' has no 'Nope'"),
    ({"entry": "user_sources:Brevity", "options": {"tone": 1}}, "reward.sources.judge.options:"),
    ({"entry": "user_sources:Brevity", "weights": {"tone": 1.0}}, "reward.sources.judge.weights: unknown components ['tone']"),
])
def test_a_bad_user_source_fails_naming_the_key_and_writes_no_rewards(ws, tmp_path, monkeypatch, source, message):
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "user_sources.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    (ws.root / "params.yaml").write_text(yaml.safe_dump(rules_only(sources={"judge": source})))
    with pytest.raises(StageError, match=message.replace("[", r"\[")):
        run_stage("reward", ws.root)
    assert not ws.rewards.exists()


def test_a_bad_label_fails_the_stage_naming_file_and_line(ws):
    sample = read_jsonl(ws.samples)[0]
    write_jsonl(ws.human_labels, [{**label_of(sample, 1.0, "ada", "correct"), "score": 7}])
    with pytest.raises(StageError, match=rf"{ws.human_labels}:1: field 'score' must be a number in \[0, 1\], got 7"):
        run_stage("reward", ws.root)
    assert not ws.rewards.exists()


def known_hack(sample: dict, task: dict, answer_id: str) -> dict:
    return {"sample_id": sample["sample_id"], "env": "rules", "task": task, "completion": sample["completion"],
            "iteration": 0, "reviewer": "ada", "time": "2025-01-01T00:00:00+00:00", "comment": "",
            "answer_id": answer_id}


def gate_inputs(ws: Workspace) -> None:
    """An evaluation where the candidate beats the champion everywhere: only a known hack can hold it."""
    summary = lambda p: {"overall": {"pass@1": p, "se": 0.0}, "envs": {"rules": {"pass@1": p, "se": 0.0}},  # noqa: E731
                         "slices": {"rules/core": {"pass@1": p, "se": 0.0}}}
    write_json(ws.evaluation, {"champion": {"model_version": "champ", "summary": summary(0.2)},
                               "candidate": {"model_version": "cand", "summary": summary(0.9)}})
    ws.candidate.mkdir(parents=True, exist_ok=True)


@pytest.mark.parametrize("which, promote", [
    ("wrong", True),  # a hack today's verifier fails: the gate decides on the figures
    ("reference", False),  # a completion the verifier still passes: held, naming it
])
def test_a_known_hack_the_verifier_still_rewards_holds_the_gate(ws, which, promote):
    tasks = {t["task_id"]: t for t in read_jsonl(ws.tasks)}
    samples = read_jsonl(ws.samples)
    chosen = samples[0] if which == "reference" else samples[2]
    write_jsonl(ws.known_hacks, [known_hack(chosen, tasks[chosen["task_id"]], "h1")])
    run_stage("reward", ws.root)
    [checked] = read_jsonl(ws.path(KNOWN_HACKS_CHECK))
    assert checked["sample_id"] == chosen["sample_id"] and checked["verifier"] == "verifier:rules"
    assert checked["passed"] is (not promote) and checked["holds"] is (not promote)
    figures = read_json(ws.metrics("reward"))["known_hacks"]
    assert figures == {"total": 1, "scoring_above_zero": int(checked["reward"] > 0), "not_judged": 0, "skipped": 0}

    gate_inputs(ws)
    run_stage("gate", ws.root)
    gate = read_json(ws.gate)
    assert gate["promote"] is promote
    if not promote:
        assert any(reason.startswith(f"known reward hack {chosen['sample_id']} (labelled by ada in iteration 0) "
                                     f"passes (reward {checked['reward']:.3f}) under verifier:rules ")
                   for reason in gate["reasons"])
    else:
        assert "known reward hacks: all 1 fail under today's verifiers" in gate["reasons"]


def test_no_labels_and_no_hacks_write_an_empty_check(ws):
    rows = rewards(ws)
    assert read_jsonl(ws.path(KNOWN_HACKS_CHECK)) == []
    assert all("human" not in row and "human" not in row["components"] for row in rows.values())
    assert set(json.loads(json.dumps(read_json(ws.metrics("reward"))["known_hacks"]))) == {
        "total", "scoring_above_zero", "not_judged", "skipped"}


def test_answers_submitted_and_merged_by_the_review_code_reach_the_rows_and_the_gate(ws):
    """The whole contract through the review side's own code: submit → inbox → merge_inbox → reward → gate."""
    from closedloop.review.labels import merge_inbox, submit

    tasks = {t["task_id"]: t for t in read_jsonl(ws.tasks)}
    before = rewards(ws)
    review = []
    for sample in read_jsonl(ws.samples)[:3]:
        verdict = before[sample["sample_id"]]
        review.append({**sample, "completion_sha256": completion_sha256(sample["completion"]), "iteration": 0,
                       "prompt": tasks[sample["task_id"]]["prompt"], "task": tasks[sample["task_id"]],
                       "verifier": {"passed": verdict["passed"], "reward": verdict["reward"], "status": verdict["status"]}})
    hacked = review[0]["sample_id"]  # a reference the verifier passes, called a hack by the reviewer
    submit(ws, {"reviewer": "ada", "answers": [{"sample_id": hacked, "score": 0.0, "label": "reward_hacking"},
                                               {"sample_id": review[2]["sample_id"], "score": 0.0, "label": "wrong"}]},
           review, "cli")
    merge_inbox(ws)

    after = rewards(ws)
    assert after[hacked]["human"]["reviewers"] == ["ada"] and after[hacked]["components"]["human"] == 0.0
    [checked] = read_jsonl(ws.path(KNOWN_HACKS_CHECK))
    assert checked["sample_id"] == hacked and checked["holds"]
    gate_inputs(ws)
    run_stage("gate", ws.root)
    gate = read_json(ws.gate)
    assert gate["promote"] is False and any(reason.startswith(f"known reward hack {hacked} ") for reason in gate["reasons"])
    agreement = read_json(ws.metrics("reward"))["agreement"]["rules"]
    assert agreement["n"] == 2 and agreement["confusion"]["both_fail"] == 1 and agreement["confusion"]["verifier_only"] == 1
