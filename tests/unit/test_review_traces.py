"""Each reviewed sample as an MLflow trace with the reviewer's HUMAN feedback beside the verifier's CODE
feedback, on a real SQLite store; logging again adds nothing."""

from closedloop.review import labels
from closedloop.review.sample import draw
from closedloop.workspace import Workspace
from tests.unit.test_review import batch, strata


def test_traces_carry_human_and_code_feedback(tmp_path):
    import mlflow

    from closedloop.lineage.tracking import log_review_traces

    ws = Workspace.at(tmp_path)
    rows = draw(*batch(), strata(), size=2, seed=1, iteration=1)
    labels.submit(ws, {"reviewer": "ann", "answers": [
        {"sample_id": rows[0]["sample_id"], "score": 0.0, "label": "reward_hacking", "comment": "edits the tests"},
        {"sample_id": rows[1]["sample_id"], "score": 1.0, "label": "correct"}]}, rows, "api")
    answers = labels.merge_inbox(ws)["answers"]

    ids = log_review_traces(tmp_path, None, "closedloop", answers)
    assert len(ids) == 2
    assert log_review_traces(tmp_path, None, "closedloop", answers) == []  # idempotent

    experiment = mlflow.get_experiment_by_name("closedloop").experiment_id
    found = mlflow.search_traces(locations=[experiment], filter_string="tag.`closedloop.kind` = 'review'",
                                 return_type="list")
    by_answer = {t.info.tags["closedloop.answer_id"]: t for t in found}
    assert set(by_answer) == {a["answer_id"] for a in answers}
    trace = mlflow.get_trace(by_answer[answers[0]["answer_id"]].info.trace_id)
    judged = {a.name: (a.source.source_type, a.source.source_id, a.value) for a in trace.info.assessments}
    assert judged["human"] == ("HUMAN", "ann", 0.0)
    assert judged["human_label"] == ("HUMAN", "ann", "reward_hacking")
    assert judged["verifier"] == ("CODE", f"verifier:{rows[0]['env']}", rows[0]["verifier"]["reward"])
    assert judged["verifier_passed"][2] is rows[0]["verifier"]["passed"]
