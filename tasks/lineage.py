"""Prefect tasks for the versioning steps around the stages (closedloop.lineage.record)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from closedloop.config import Params
from closedloop.lineage import record
from closedloop.workspace import Workspace


@task(name="close-loop", persist_result=False, cache_policy=NO_CACHE)
def close_loop(workspace: str) -> str:
    return record.close_loop(Workspace.at(workspace))


@task(name="begin-iteration", persist_result=False, cache_policy=NO_CACHE)
def begin_iteration(workspace: str, params: Params, previous: Params) -> Params:
    return record.begin_iteration(Workspace.at(workspace), params, previous)


# Pushing to the DVC remote is plain, idempotent I/O: the one step where a retry helps. Registration
# is not retried: a second attempt could register a model version twice.
@task(name="push", retries=2, retry_delay_seconds=2, persist_result=False, cache_policy=NO_CACHE)
def push(workspace: str, params: Params) -> int:
    return record.push(Workspace.at(workspace), params)


@task(name="register-warm-start", persist_result=False, cache_policy=NO_CACHE)
def register_warm_start(workspace: str, params: Params) -> str:
    return record.register_warm_start(Workspace.at(workspace), params)


@task(name="version", persist_result=False, cache_policy=NO_CACHE)
def version(workspace: str, params: Params, stage_seconds: dict[str, float]) -> dict:
    return record.record_iteration(Workspace.at(workspace), params, stage_seconds)


@task(name="record-failure", persist_result=False, cache_policy=NO_CACHE)
def record_failure(workspace: str, params: Params, stage: str, error: str) -> str:
    return record.record_failure(Workspace.at(workspace), params, stage, RuntimeError(error))
