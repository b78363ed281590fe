"""Prefect tasks of the review flow: read the review sample, queue a reviewer's answers. Thin wrappers
over closedloop.review.labels; no logic here."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from closedloop.review import labels
from closedloop.workspace import Workspace


@task(name="read-review-sample", persist_result=False, cache_policy=NO_CACHE)
def read_review_sample(workspace: str) -> list[dict[str, Any]]:
    ws = Workspace.at(workspace)
    return labels.read_review_sample(ws) if ws.review_sample.exists() else []


@task(name="queue-answers", persist_result=False, cache_policy=NO_CACHE)
def queue_answers(workspace: str, submission: dict[str, Any], review: list[dict[str, Any]],
                  source: str) -> list[dict[str, Any]]:
    """Validated as a whole, then appended to the inbox; raises labels.AnswerError (nothing written)."""
    return labels.submit(Workspace.at(workspace), submission, review, source)
