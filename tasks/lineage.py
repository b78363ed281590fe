"""Prefect tasks for the versioning steps around the stages (closedloop.versioning)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from closedloop.config import Params
from closedloop.versioning import failures, loop, register, resume, reviews
from closedloop.workspace import Workspace


@task(name="close-loop", persist_result=False, cache_policy=NO_CACHE)
def close_loop(workspace: str, closed: str | None = None) -> str:
    ws = Workspace.at(workspace)
    champion = loop.close_loop(ws, closed)
    resume.closed_loop_on(ws, champion)
    return champion


@task(name="begin-iteration", persist_result=False, cache_policy=NO_CACHE)
def begin_iteration(workspace: str, params: Params, previous: Params, flow_run_ids: list[str] | None = None):
    return resume.begin_iteration(Workspace.at(workspace), params, previous, flow_run_ids)


@task(name="merge-reviews", persist_result=False, cache_policy=NO_CACHE)
def merge_reviews(workspace: str, params: Params, resuming: bool = False) -> dict:
    return reviews.merge_reviews(Workspace.at(workspace), params, resuming)


@task(name="record-review", persist_result=False, cache_policy=NO_CACHE)
def record_review(workspace: str, params: Params, review: dict) -> dict:
    return reviews.record_review(Workspace.at(workspace), params, review)


# Not a task: a look-up on resume only.
def review_settled(workspace: str, iteration: int) -> bool:
    return reviews.review_settled(Workspace.at(workspace), iteration)


@task(name="preflight", persist_result=False, cache_policy=NO_CACHE)
def preflight(workspace: str, params: Params, warm_start: bool = False) -> list[str]:
    return resume.preflight(Workspace.at(workspace), params, warm_start=warm_start)


# Not a task: a look-up on resume only, where a task's own overhead would be most of its cost.
def stage_done(workspace: str, stage: str) -> bool:
    return resume.stage_done(Workspace.at(workspace), stage)


def note_stage(workspace: str, stage: str, done: bool) -> None:
    resume.note_stage(Workspace.at(workspace), stage, done)


def finish_iteration(workspace: str) -> None:
    resume.finish_iteration(Workspace.at(workspace))


# Pushing to the DVC remote is plain, idempotent I/O: the one step where a retry helps. Registration
# is not retried: a second attempt could register a model version twice.
@task(name="push", retries=2, retry_delay_seconds=2, persist_result=False, cache_policy=NO_CACHE)
def push(workspace: str, params: Params) -> int:
    return register.push(Workspace.at(workspace), params)


@task(name="register-warm-start", persist_result=False, cache_policy=NO_CACHE)
def register_warm_start(workspace: str, params: Params) -> str:
    return register.register_warm_start(Workspace.at(workspace), params)


@task(name="version", persist_result=False, cache_policy=NO_CACHE)
def version(workspace: str, params: Params, stage_seconds: dict[str, float]) -> dict:
    return register.record_iteration(Workspace.at(workspace), params, stage_seconds)


@task(name="record-failure", persist_result=False, cache_policy=NO_CACHE)
def record_failure(workspace: str, params: Params, stage: str, error: str, final: bool = False) -> str:
    return failures.record_failure(Workspace.at(workspace), params, stage, error, final=final)


# Not a task: it runs before anything else reads the workspace, the moment the lock is held.
def recover_git_state(workspace: str) -> list[str]:
    return resume.recover_git_state(Workspace.at(workspace))
