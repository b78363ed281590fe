"""Human review through Prefect's own pause/resume: the flow shows this iteration's review sample as a
form in the Prefect UI and waits for a reviewer's answers.

The form is built per review sample: one optional sub-form per sample (score 0..1, label, comment), keyed
by the sample id, and one reviewer field; the Markdown above it shows each sample's prompt, completion,
verdict and step signals. Prefect stores the form's JSON schema with the paused run, and the server
validates an answer against it before it resumes the run (the UI's form and `resume_flow_run(id,
run_input={...})` alike): an out-of-range score, an unknown label or an unknown sample id is refused
naming the field, and the run stays paused. What the schema cannot say (no sample scored) is checked
here again; then the run pauses once more, the reason shown above the form, until the timeout.

Answers go to the inbox (closedloop.review.labels); the next iteration merges them into the labels file.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import pydantic
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import BaseModel, ConfigDict, Field

from closedloop.config import Params
from closedloop.review.form import review_markdown
from closedloop.review.labels import AnswerError, Label
from flows.hooks import flow_run_id
from tasks import review as review_tasks


class SampleAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    score: float = Field(ge=0.0, le=1.0, description="0: wrong … 1: fully right")
    label: Label = Field(description="correct, wrong, reward_hacking, formatting or other")
    comment: str = Field("", description="Why, in a few words (optional)")


class ReviewForm(RunInput):
    reviewer: str = Field(min_length=1, description="Your name or id; recorded with every answer")

    def submission(self) -> dict[str, Any]:
        """The answers given, as labels.Submission data (samples left empty are skipped)."""
        answers = []
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if isinstance(value, SampleAnswer):
                answers.append({"sample_id": info.alias, **value.model_dump()})
        return {"reviewer": self.reviewer, "answers": answers}


def review_form(rows: list[dict[str, Any]], note: str = "") -> type[ReviewForm]:
    """A RunInput class for these samples. Field names must be identifiers; the sample ids are the
    aliases, so the schema (and run_input) is keyed by sample id and a key that is no sample is extra."""
    fields = {
        f"sample_{number}": (Optional[SampleAnswer],
                             Field(None, alias=row["sample_id"], title=f"{number}. {row['sample_id']}"))
        for number, row in enumerate(rows, start=1)
    }
    form = pydantic.create_model("ReviewForm", __base__=ReviewForm, **fields)
    return form.with_initial_data(description=review_markdown(rows, note))


@flow(name="closedloop-review", log_prints=True)
def review_flow(workspace: str = ".", timeout_s: float = 3600.0, poll_interval_s: int = 10) -> dict:
    """Show this iteration's review sample as a form and queue the answers for the next iteration.

    Args:
        workspace: the closedloop workspace whose data/batch/review_sample.jsonl is reviewed.
        timeout_s: how long to wait for answers; then the flow ends recording that none came.
        poll_interval_s: how often the paused flow asks the API whether it was answered.
    """
    logger = get_run_logger()
    rows = review_tasks.read_review_sample(workspace)
    run_id = flow_run_id()
    if not rows:
        return _finish(rows, {"state": "empty", "answers": 0, "reviewers": []},
                       "No review sample: review.mode is off, or the batch had nothing to draw.")
    deadline = time.monotonic() + timeout_s
    note, attempt = "", 0
    while (left := deadline - time.monotonic()) > 0:
        attempt += 1
        form = review_form(rows, note)
        try:
            answer = pause_flow_run(wait_for_input=form, timeout=max(1, math.ceil(left)),
                                    poll_interval=max(1, min(poll_interval_s, math.ceil(left))),
                                    key=f"review-{attempt}")
        except FlowPauseTimeout:
            _running_again(run_id)
            break
        try:
            queued = review_tasks.queue_answers(workspace, answer.submission(), rows,
                                                f"prefect-ui:{run_id}" if run_id else "prefect-ui")
        except AnswerError as error:  # nothing was written; ask again, saying why
            note = f"Not recorded: {error}. Please answer again."
            logger.warning("review answer refused: %s", error)
            continue
        reviewers = sorted({row["reviewer"] for row in queued})
        return _finish(rows, {"state": "answered", "answers": len(queued), "reviewers": reviewers},
                       f"{len(queued)} answer(s) from {', '.join(reviewers)} queued for the next iteration's "
                       "`human` reward component.")
    return _finish(rows, {"state": "timed_out", "answers": 0, "reviewers": []},
                   f"No human scores came within {timeout_s:g} s; the loop continues without them.")


def _running_again(run_id: str | None) -> None:
    """After a pause timed out, Prefect's server refuses every transition out of Paused but Failed
    ("The flow was completed and never resumed"), so a review nobody answered would read as a failed
    run. A timeout is an expected outcome here: the run is set Running again (force: past the pause
    rule) and finishes Completed, its artifact saying no scores came."""
    if not run_id:
        return
    from prefect import get_client
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Running(message="review timed out without answers"), force=True)


def _finish(rows: list[dict[str, Any]], result: dict, sentence: str) -> dict:
    iteration = rows[0]["iteration"] if rows else None
    create_markdown_artifact(
        key=f"review-iteration-{iteration}" if iteration is not None else "review",
        markdown=f"# Human review{f' of iteration {iteration}' if iteration is not None else ''}\n\n"
        f"**{result['state']}**: {sentence}\n",
        description=f"Human review: {result['state']}",
    )
    print(sentence)
    return {**result, "samples": len(rows), "iteration": iteration}


def review_for_iteration(workspace: str, params: Params) -> dict:
    """review.mode before_promotion: the iteration flow waits here (a subflow) after evaluate, before the
    gate, for review.timeout_s at most. Returns {"state": "answered" | "timed_out" | "empty", "answers",
    "reviewers", ...}."""
    return review_flow(workspace=workspace, timeout_s=params.review.timeout_s)
