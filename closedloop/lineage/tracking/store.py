"""The tracking store itself: checking it is reachable and sound before a run records into it, and the
review answers logged as MLflow traces."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from closedloop.lineage.tracking.client import (
    _mlflow,
    configure,
    tracking_uri,
)


def check_store(workspace: Path, uri: str | None, timeout_s: float = 10.0) -> str:
    """Fail fast, before any work, when the tracking store that ``tracking_uri`` resolves to cannot be
    reached; return the resolved URI. ConnectionError naming the URI (its password masked) and why.

    sqlite: the database's directory exists and is writable (the database itself is not created);
    http(s): ``GET <uri>/health`` (an MLflow server answers "OK") within ``timeout_s``; file: URIs and
    plain paths: the directory is writable, or can be made in a writable parent. Other schemes
    (postgresql://, databricks, ...) are not checked here."""
    from urllib.parse import unquote, urlsplit

    resolved = tracking_uri(workspace, uri)
    parts = urlsplit(resolved)
    shown = resolved.replace(f":{parts.password}@", ":***@") if parts.password else resolved
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        import httpx

        health = resolved.rstrip("/") + "/health"
        try:
            response = httpx.get(health, timeout=timeout_s, follow_redirects=True)
        except httpx.HTTPError as error:
            raise ConnectionError(f"MLflow tracking store {shown} cannot be reached: GET /health failed "
                                  f"({type(error).__name__}: {error}; timeout {timeout_s:g} s)") from None
        if response.status_code != 200:
            raise ConnectionError(f"MLflow tracking store {shown} answered GET /health with HTTP "
                                  f"{response.status_code}: is it an MLflow server?")
        return resolved
    if scheme == "sqlite":
        path = resolved.split("://", 1)[1].lstrip("/").split("?", 1)[0]
        if not path or path == ":memory:":
            return resolved  # in memory: nothing to reach
        # sqlite:////abs/db (an absolute path) or sqlite:///rel/db (relative to the cwd), as SQLAlchemy reads it
        database = Path("/" + path) if resolved.split("://", 1)[1].startswith("//") else Path(path)
        directory = database.parent
        if not directory.is_dir():
            raise ConnectionError(f"MLflow tracking store {shown}: the directory {directory} does not exist")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConnectionError(f"MLflow tracking store {shown}: the directory {directory} is not writable")
        if database.exists() and not (database.is_file() and os.access(database, os.R_OK | os.W_OK)):
            raise ConnectionError(f"MLflow tracking store {shown}: {database} is not a readable, writable file")
        return resolved
    if scheme in ("file", ""):
        directory = Path(unquote(parts.path)) if scheme == "file" else Path(resolved)
        existing = directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            what = "is not a writable directory" if existing == directory else \
                f"does not exist and cannot be made ({existing} is not a writable directory)"
            raise ConnectionError(f"MLflow tracking store {shown}: {directory} {what}")
        return resolved
    return resolved


def log_review_traces(workspace: Path, uri: str | None, experiment: str, answers: list[Mapping[str, Any]],
                      run_id: str | None = None) -> list[str]:
    """One MLflow trace per human review answer, carrying the reviewer's HUMAN feedback (``human``: the
    score, ``human_label``) beside the verifier's CODE feedback (``verifier``: its reward,
    ``verifier_passed``), so the MLflow UI shows the two judgements of a sample side by side.

    ``answers``: label rows (data/labels/human.jsonl) or the inbox rows ``merge_inbox`` returns, whose
    ``sample`` (prompt, completion) becomes the trace's inputs and outputs. Idempotent: an answer whose
    trace exists (tag closedloop.answer_id) is not logged again. ``run_id`` links the traces to a run.
    Returns the ids of the traces logged now."""
    mlflow = _mlflow()
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    configure(workspace, uri, experiment)
    experiment_id = mlflow.get_experiment_by_name(experiment).experiment_id
    done = set()
    for trace in mlflow.search_traces(locations=[experiment_id], filter_string="tag.`closedloop.kind` = 'review'",
                                      return_type="list"):
        done.add(trace.info.tags.get("closedloop.answer_id"))
    traces = []
    for answer in answers:
        if answer["answer_id"] in done:
            continue
        sample = answer.get("sample") or {}
        with mlflow.start_span(name=f"review {answer['sample_id']}") as span:
            span.set_inputs({"sample_id": answer["sample_id"], "task_id": answer["task_id"], "env": answer["env"],
                             **({"prompt": sample["prompt"]} if "prompt" in sample else {})})
            span.set_outputs({"completion": sample["completion"]} if "completion" in sample
                             else {"completion_sha256": answer["completion_sha256"]})
            mlflow.update_current_trace(
                tags={"closedloop.kind": "review", "closedloop.answer_id": answer["answer_id"],
                      "closedloop.iteration": str(answer["iteration"]), "closedloop.env": answer["env"],
                      "closedloop.model_version": answer["model_version"]},
                metadata={"mlflow.sourceRun": run_id} if run_id else None,
            )
            traces.append((span.trace_id, answer))
    # Traces are exported in the background; an assessment on one not yet written is refused ("not found").
    mlflow.flush_trace_async_logging()
    for trace_id, answer in traces:
        verdict = answer["verifier"]
        human = AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=answer["reviewer"])
        code = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id=f"verifier:{answer['env']}")
        mlflow.log_feedback(trace_id=trace_id, name="human", value=float(answer["score"]), source=human,
                            rationale=answer.get("comment") or None,
                            metadata={"label": answer["label"], "answer_id": answer["answer_id"],
                                      "time": answer["time"], "source": answer.get("source", "")})
        mlflow.log_feedback(trace_id=trace_id, name="human_label", value=answer["label"], source=human)
        mlflow.log_feedback(trace_id=trace_id, name="verifier", value=float(verdict["reward"]), source=code,
                            rationale=f"status {verdict['status']}", metadata={"status": verdict["status"]})
        mlflow.log_feedback(trace_id=trace_id, name="verifier_passed", value=bool(verdict["passed"]), source=code)
    return [trace_id for trace_id, _ in traces]
