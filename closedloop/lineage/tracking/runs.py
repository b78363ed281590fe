"""One MLflow run per iteration: its params, metrics, datasets and artifacts; finding runs again by
their tags (a rerun resumes its own) and ending the ones a killed process left running."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from closedloop.faults import fault_point
from closedloop.lineage.tracking.client import (
    _END_STATUSES,
    _MAX_METRICS_PER_BATCH,
    _MAX_PARAM_VALUE,
    _MAX_PARAMS_PER_BATCH,
    _TRUNCATED,
    HIST_ARTIFACT,
    ITERATION_TAG,
    _chunks,
    _mlflow,
    _now_ms,
    _quoted,
)


@dataclass(frozen=True)
class DatasetInput:
    name: str
    path: str
    digest: str  # the DVC md5 of the file, so the MLflow input and the DVC pointer name the same bytes
    context: str  # e.g. "training", "evaluation"
    frame: Any  # pandas DataFrame (schema and row count go to MLflow, not the rows)


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> {"a.b.c": "value"}; lists as JSON; values cut to MLflow's length limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, prefix=f"{name}."))
            continue
        text = json.dumps(value, default=str) if isinstance(value, (list, tuple, Mapping)) else str(value)
        if len(text) > _MAX_PARAM_VALUE:
            text = text[: _MAX_PARAM_VALUE - len(_TRUNCATED)] + _TRUNCATED
        flat[name] = text
    return flat


def _log_metric_batch(client: Any, run_id: str, metrics: Mapping[str, float], step: int = 0,
                      timestamp_ms: int | None = None) -> None:
    from mlflow.entities import Metric

    # The step is what the charts put on the x axis: the iteration, so each run is one point of a curve.
    stamp = _now_ms() if timestamp_ms is None else int(timestamp_ms)
    entities = [Metric(key, float(value), stamp, int(step)) for key, value in metrics.items()]
    for chunk in _chunks(entities, _MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=chunk)


def _reward_figure(rewards: list[float]) -> Any:
    # A bare Figure renders with Agg without pyplot, so the process-wide backend is left alone.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3), dpi=100)
    ax = fig.add_subplot()
    ax.hist(rewards, bins=20, range=(0.0, 1.0), color="#4c72b0")
    ax.set_xlabel("reward")
    ax.set_ylabel("samples")
    ax.set_title(f"reward distribution (n={len(rewards)})")
    fig.tight_layout()
    return fig


def log_iteration(
    *,
    iteration: int,
    run_name: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    rewards: list[float],
    datasets: list[DatasetInput],
    artifacts: list[Path],
    stage_seconds: Mapping[str, float],
    status: str = "FINISHED",
    started_ms: int | None = None,
) -> str:
    """Record one iteration as a run in the active experiment; return its run_id.

    Every metric is logged at ``step = iteration``. ``stage_seconds`` are logged as
    ``timing/<stage>``. ``rewards`` give the histogram artifact (their figures are the caller's
    metrics). ``started_ms`` (ms since the epoch) is when the iteration began: the run starts then,
    not when logging does, so its duration is the iteration's (:func:`end_run` moves its end).

    ``status="FAILED"`` records an iteration that stopped early (e.g. its batch failed validation)
    with whatever it produced, so it shows up in the history rather than vanishing.
    """
    if status not in _END_STATUSES:
        raise ValueError(f"status must be one of {_END_STATUSES}, got {status!r}")
    missing = [str(p) for p in artifacts if not Path(p).exists()]
    if missing:  # checked first, so a bad path does not leave a half-logged FAILED run behind
        raise FileNotFoundError(f"artifacts to log do not exist: {missing}")
    mlflow = _mlflow()
    from mlflow.entities import Param
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.tracking.fluent import _get_experiment_id

    all_metrics = {**{f"timing/{name}": secs for name, secs in stage_seconds.items()}, **metrics}

    client = mlflow.MlflowClient()
    run_tags = {**{k: str(v) for k, v in tags.items()}, ITERATION_TAG: str(iteration)}
    # Created through the client because only create_run takes a start time; resolve_tags adds the
    # source and user tags mlflow.start_run would, and the run is then resumed for the fluent loggers.
    # The experiment is the active one (configure set it); MLflow has no public getter for its id.
    created = client.create_run(_get_experiment_id(), start_time=started_ms, tags=resolve_tags(run_tags),
                                run_name=run_name)
    with mlflow.start_run(run_id=created.info.run_id) as run:
        run_id = run.info.run_id
        flat = [Param(k, v) for k, v in flatten_params(params).items()]
        for chunk in _chunks(flat, _MAX_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=chunk)
        # the untruncated, nested original (default=str: paths and enums in params stay loggable)
        mlflow.log_text(json.dumps(params, indent=2, default=str), "params/params.json")
        _log_metric_batch(client, run_id, all_metrics, step=iteration)

        fault_point("version:mlflow-log")  # tests kill a run here: the MLflow run open, half logged
        for ds in datasets:
            with warnings.catch_warnings():
                # MLflow registers two local-file source classes under one name and warns that a
                # plain path matches both; either resolution records the same path.
                warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
                # Batch tables are never model inputs: MLflow's hint about integer columns and missing
                # values at inference time does not apply.
                warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer column")
                dataset = mlflow.data.from_pandas(ds.frame, source=ds.path, name=ds.name, digest=ds.digest)
                mlflow.log_input(dataset, context=ds.context)
        if rewards:
            mlflow.log_figure(_reward_figure(rewards), HIST_ARTIFACT)
        for path in map(Path, artifacts):
            if path.is_dir():
                mlflow.log_artifacts(str(path), artifact_path=f"reports/{path.name}")
            else:
                mlflow.log_artifact(str(path), artifact_path="reports")
    if status != "FINISHED":  # the context manager always ends a run without an exception as FINISHED
        client.set_terminated(run_id, status=status)
    return run_id


def end_run(run_id: str, ended_ms: int | None = None, status: str = "FINISHED") -> None:
    """End the run at ``ended_ms`` (now if None): the moment the iteration's version step ended,
    after the registry and the aliases, not when the run's logging did."""
    if status not in _END_STATUSES:
        raise ValueError(f"status must be one of {_END_STATUSES}, got {status!r}")
    _mlflow().MlflowClient().set_terminated(run_id, status=status, end_time=_now_ms() if ended_ms is None else ended_ms)


def run_location(run_id: str) -> dict[str, str]:
    """Where a person finds the run: {"tracking_uri", "experiment_id", "run_id", "run_name"}."""
    mlflow = _mlflow()
    info = mlflow.MlflowClient().get_run(run_id).info
    return {"tracking_uri": mlflow.get_tracking_uri(), "experiment_id": str(info.experiment_id),
            "run_id": run_id, "run_name": info.run_name or ""}


def set_run_tags(run_id: str, tags: Mapping[str, str]) -> None:
    from mlflow.entities import RunTag

    client = _mlflow().MlflowClient()
    for chunk in _chunks([RunTag(k, str(v)) for k, v in tags.items()], _MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, tags=chunk)


def log_metrics(run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
    _log_metric_batch(_mlflow().MlflowClient(), run_id, metrics, step=step)


def log_text_artifact(run_id: str, text: str, artifact_file: str) -> str:
    """Log ``text`` as the artifact ``artifact_file`` of the run (the iteration's report page); return
    its artifact URI (for a local store a file: URI a browser opens)."""
    client = _mlflow().MlflowClient()
    client.log_text(run_id, text, artifact_file)
    return client.get_run(run_id).info.artifact_uri.rstrip("/") + "/" + artifact_file


def find_runs(experiment: str, tags: Mapping[str, str], status: str | None = None) -> list[str]:
    """Run ids of ``experiment`` carrying every tag in ``tags`` (and in ``status``), newest first."""
    client = _mlflow().MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    clauses = [f"tags.`{key}` = {_quoted(value)}" for key, value in tags.items()]
    if status:
        clauses.append(f"attributes.status = {_quoted(status)}")
    runs = client.search_runs([found.experiment_id], filter_string=" and ".join(clauses),
                              order_by=["attributes.start_time DESC"])
    return [run.info.run_id for run in runs]


def run_key(workspace: Path | str, iteration: int, kind: str) -> dict[str, str]:
    """The tags that name an iteration's MLflow run: a rerun finds it by them."""
    return {"closedloop.iteration": str(iteration), "closedloop.kind": kind, "closedloop.workspace": str(workspace)}


def end_interrupted_runs(experiment: str, tags: Mapping[str, str], reason: str) -> list[str]:
    """End as KILLED every RUNNING run of ``experiment`` with ``tags``: its process died mid-logging
    (the caller holds the workspace lock, so no live process is logging to it). Returns their ids."""
    client = _mlflow().MlflowClient()
    ended = find_runs(experiment, tags, status="RUNNING")
    for run_id in ended:
        client.set_tag(run_id, "closedloop.interrupted", reason[:4000])
        client.set_terminated(run_id, status="KILLED")
        # renamed, so the runs table does not show two runs of one name, one finished and one not
        name = client.get_run(run_id).info.run_name or run_id
        client.update_run(run_id, name=f"{name}-interrupted")
    return ended


def recent_iterations(experiment: str, limit: int = 10) -> list[dict[str, Any]]:
    """Newest first: {run_id, run_name, iteration, status, start_time, metrics, tags} per run."""
    client = _mlflow().MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time DESC"], max_results=limit)
    out = []
    for run in runs:
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}  # user tags only
        iteration = tags.get(ITERATION_TAG)
        out.append(
            {
                "run_id": run.info.run_id,
                "run_name": run.info.run_name,
                "iteration": int(iteration) if iteration is not None and iteration.isdigit() else None,
                "status": run.info.status,
                "start_time": run.info.start_time,  # ms since the epoch
                "metrics": dict(run.data.metrics),
                "tags": tags,
            }
        )
    return out
