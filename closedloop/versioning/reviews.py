"""Human review around an iteration: merging the answers queued since the last one into the labels
at its start, and recording the review before promotion as the gate's input."""

from __future__ import annotations

from typing import Any

from closedloop import workspace as paths
from closedloop.config import Params
from closedloop.io import read_json, say, write_json
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.review.labels import inbox_rows_for, merge_inbox, queued_answers
from closedloop.versioning.loop import ensure_labels
from closedloop.versioning.store import open_store
from closedloop.workspace import Workspace


def merge_reviews(ws: Workspace, params: Params, resuming: bool = False) -> dict[str, Any]:
    """At an iteration's start, under the lock: the review answers queued since the last iteration
    (the inbox) move into the labels file and the known hacks, each answered sample goes to MLflow as
    a trace with the reviewer's and the verifier's assessments, and the iteration's review outcome
    starts as "not yet asked". close_loop then records all three with `dvc add`.

    A resumed iteration merges nothing: its inputs must be what its first attempt read, and answers
    about its own batch (queued while it ran, or given to its review before the kill) must stay in
    the inbox for its gate and for the next iteration."""

    ensure_labels(ws)
    counts = {"merged": 0, "duplicates": 0, "known_hacks": 0, "torn": 0}
    if not resuming:
        queued = queued_answers(ws)
        if queued:
            # Before the merge empties the inbox: traces are looked up by answer id, so a run killed
            # after logging them logs nothing twice; one that fails to log them keeps the answers.
            try:
                open_store(ws, params).log_review_traces(ws.root, params.tracking.uri, params.tracking.experiment,
                                                         queued)
            except Exception as error:  # noqa: BLE001  (a view of the labels; the labels file is the record)
                say(f"closedloop: warning: the review answers could not be logged as MLflow traces: {error}")
        counts = merge_inbox(ws)
        if counts["merged"]:
            say(f"closedloop: {counts['merged']} review answer(s) merged into {paths.HUMAN_LABELS}"
                + (f", {counts['known_hacks']} new known reward hack(s)" if counts["known_hacks"] else "")
                + "; this iteration's reward stage reads them as the human component")
        if counts["torn"]:
            say(f"closedloop: warning: {counts['torn']} review answer(s) cut short by a kill were dropped")
    outcome = read_json(ws.review_outcome)
    if outcome.get("iteration") != params.loop.iteration:  # a resumed iteration keeps what its review said
        write_review_outcome(ws, params, state="pending" if params.review.mode == "before_promotion"
                             else "not_requested", answers=[])
    return {key: value for key, value in counts.items() if key != "answers"}


def review_settled(ws: Workspace, iteration: int) -> bool:
    """Whether this iteration's review before promotion already came back (a resumed run skips it)."""
    outcome = read_json(ws.review_outcome) if ws.review_outcome.exists() else {}
    return outcome.get("iteration") == iteration and outcome.get("state") not in (None, "pending", "not_requested")


def write_review_outcome(ws: Workspace, params: Params, state: str, answers: list[dict[str, Any]]) -> dict:
    """data/reports/review.json: what the review of this iteration's batch said before its gate."""

    outcome = {"iteration": params.loop.iteration, "mode": params.review.mode, "state": state,
               "reviewers": sorted({row["reviewer"] for row in answers}),
               "answers": [{key: row[key] for key in ("answer_id", "sample_id", "env", "reviewer", "score",
                                                      "label", "comment", "verifier") if key in row}
                           for row in answers]}
    write_json(ws.review_outcome, outcome)
    return outcome


def record_review(ws: Workspace, params: Params, review: dict[str, Any]) -> dict:
    """After a review before promotion: the answers this iteration's batch received (from the form, the
    API or `closedloop review`, all waiting in the inbox until the next iteration) become the gate's
    input, recorded with `dvc add`."""

    answers = inbox_rows_for(ws, params.loop.iteration)
    state = "answered" if answers else ("timed_out" if review.get("state") == "timed_out" else review.get("state", ""))
    outcome = write_review_outcome(ws, params, state, answers)
    DvcWorkspace(ws.root).add(paths.REVIEW_OUTCOME)
    return outcome
