"""MLflow adapter: one run per iteration, one registry version per candidate, aliases for roles.

The only module that imports ``mlflow`` (lazily, inside each function: the import takes ~2 s and
``closedloop --help`` must stay fast). Everything the loop records goes through these functions,
so the MLflow layout lives in one place:

- run (one per iteration): params flattened to dotted keys, metrics at ``step = iteration`` (so the
  experiment's charts draw one point per iteration; names and sections: lineage.run_metrics), a
  start and end that span the iteration, dataset inputs carrying their DVC md5 as digest,
  ``plots/reward_hist.png``, ``reports/...``;
- registered model version: a LoggedModel of that run registered with lineage tags on the version;
  ``champion`` / ``challenger`` are registry aliases.

Model versions hold a reference, not the weights. DVC already keeps every model folder (its cache
and remote); a copy per version in ``mlartifacts/`` too made the registry the biggest store of a
workspace. So a version is an external LoggedModel (``mlflow.create_external_model``: no flavor,
no weights) whose artifacts are two small files:

- ``reference.json``: the DVC hash of the model folder (md5 ``….dir``, size, nfiles), the path it
  had in the workspace, the workspace, the DVC remote and the git commit;
- ``weights.dvc``: a DVC pointer file for that hash.

Getting the weights of a version back (from the DVC cache, or the remote when the cache lacks them):

    >>> ref = tracking.model_reference("closedloop-policy", "champion")   # alias or version number
    >>> DvcWorkspace(ref["workspace"]).restore(ref, "restore/champion")   # a folder in the workspace

or with the command-line tools, from the workspace:

    mlflow artifacts download -u models:/closedloop-policy@champion -d restore/champion
    dvc pull restore/champion/weights.dvc      # -> restore/champion/weights/

A version tagged ``dvc.exp_rev`` can also be had as ``dvc get . data/models/candidate --rev <rev>``.
``tracking.log_weights: true`` in params.yaml logs the full model with the transformers flavor as
well (loadable with ``mlflow.transformers.load_model``; one more full copy per version).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from closedloop.faults import fault_point
from closedloop.lineage.mlflow_layout import (
    END_STATUSES,
    HIST_ARTIFACT,
    ITERATION_TAG,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_PER_BATCH,
    MODEL_ARTIFACT,
    POINTER_ARTIFACT,
    REFERENCE_ARTIFACT,
    WEIGHTS_TAG,
    DatasetInput,
    chunks,
    flatten_params,
    load_components,
    now_ms,
    pip_requirements,
    quiet_hf,
    quoted,
    reward_figure,
    tracking_uri,
)


def _mlflow() -> Any:
    """Import mlflow with offline-friendly, quiet defaults (an explicit environment setting wins)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no usage pings from offline machines
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # bars flood stage logs
    import mlflow

    if "MLFLOW_LOGGING_LEVEL" not in os.environ:
        # INFO is "Creating initial MLflow database tables..." and the like; set here rather than via
        # the variable because mlflow may already have been imported (and configured) by someone else.
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow


def configure(workspace: Path, uri: str | None, experiment: str) -> str:
    """Point MLflow at the store, make ``experiment`` exist and active; return the tracking URI.

    The experiment gets an explicit artifact location inside the workspace: MLflow's default puts
    artifacts in ``./mlruns`` of whatever directory the process happens to run in.
    """
    mlflow = _mlflow()
    from mlflow.exceptions import MlflowException

    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    resolved = tracking_uri(workspace, uri)
    exported = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(resolved)
    # set_tracking_uri also exports MLFLOW_TRACKING_URI (for subprocesses). Left set, it would outrank
    # the next workspace's own store in this process (the variable wins in tracking_uri), so a second
    # workspace would record into the first one's; only a variable the user set stays.
    if exported is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = exported
    client = mlflow.MlflowClient(resolved)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        try:
            client.create_experiment(experiment, artifact_location=(workspace / "mlartifacts").as_uri())
        except MlflowException as err:  # another process created it between the get and the create
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
    elif found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    mlflow.set_experiment(experiment)
    return resolved


def _log_metric_batch(client: Any, run_id: str, metrics: Mapping[str, float], step: int = 0,
                      timestamp_ms: int | None = None) -> None:
    from mlflow.entities import Metric

    # The step is what the charts put on the x axis: the iteration, so each run is one point of a curve.
    stamp = now_ms() if timestamp_ms is None else int(timestamp_ms)
    entities = [Metric(key, float(value), stamp, int(step)) for key, value in metrics.items()]
    for chunk in chunks(entities, MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=chunk)


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
    if status not in END_STATUSES:
        raise ValueError(f"status must be one of {END_STATUSES}, got {status!r}")
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
        for chunk in chunks(flat, MAX_PARAMS_PER_BATCH):
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
            mlflow.log_figure(reward_figure(rewards), HIST_ARTIFACT)
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
    if status not in END_STATUSES:
        raise ValueError(f"status must be one of {END_STATUSES}, got {status!r}")
    _mlflow().MlflowClient().set_terminated(run_id, status=status, end_time=now_ms() if ended_ms is None else ended_ms)


def run_location(run_id: str) -> dict[str, str]:
    """Where a person finds the run: {"tracking_uri", "experiment_id", "run_id", "run_name"}."""
    mlflow = _mlflow()
    info = mlflow.MlflowClient().get_run(run_id).info
    return {"tracking_uri": mlflow.get_tracking_uri(), "experiment_id": str(info.experiment_id),
            "run_id": run_id, "run_name": info.run_name or ""}


def set_run_tags(run_id: str, tags: Mapping[str, str]) -> None:
    from mlflow.entities import RunTag

    client = _mlflow().MlflowClient()
    for chunk in chunks([RunTag(k, str(v)) for k, v in tags.items()], MAX_PARAMS_PER_BATCH):
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
    clauses = [f"tags.`{key}` = {quoted(value)}" for key, value in tags.items()]
    if status:
        clauses.append(f"attributes.status = {quoted(status)}")
    runs = client.search_runs([found.experiment_id], filter_string=" and ".join(clauses),
                              order_by=["attributes.start_time DESC"])
    return [run.info.run_id for run in runs]


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


def log_and_register_model(
    *,
    run_id: str,
    model_dir: Path,
    registered_model: str,
    tags: Mapping[str, str],
    reference: Mapping[str, Any] | None = None,
    log_weights: bool = False,
    task: str = "text-generation",
) -> str:
    """Register the model in ``model_dir`` as a new version of ``registered_model``, logged as a
    LoggedModel of ``run_id``; return the version.

    ``reference`` (from ``DvcWorkspace.reference``) names the DVC-tracked bytes of ``model_dir``;
    the LoggedModel holds it instead of the weights (see the module docstring). ``log_weights``
    also logs the whole model with the transformers flavor (the behaviour before references).
    Tags are set on the version as it is created, so no reader ever sees a version without its lineage.
    """
    mlflow = _mlflow()
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    if reference is None and not log_weights:
        raise ValueError("log_and_register_model: a model version needs a DVC reference (or log_weights=True)")
    version_tags = {k: str(v) for k, v in tags.items()}
    model_tags = {WEIGHTS_TAG: "mlflow" if log_weights else "dvc"}
    if reference is not None:
        model_tags.update({f"dvc.{key}": str(reference[key]) for key in ("md5", "path", "workspace", "remote")
                           if reference.get(key)})
    client = mlflow.MlflowClient()
    if log_weights:
        with quiet_hf():
            components = load_components(model_dir, task)  # outside the run: a bad directory is not a failed run
            # reopening the iteration's run puts the model (and its LoggedModel) under it
            with mlflow.start_run(run_id=run_id):
                info = mlflow.transformers.log_model(
                    transformers_model=components,
                    name=MODEL_ARTIFACT,
                    task=task,
                    pip_requirements=pip_requirements(),
                )
        model_id = info.model_id
        client.set_logged_model_tags(model_id, model_tags)
    else:
        model_id = mlflow.create_external_model(
            name=MODEL_ARTIFACT, source_run_id=run_id, tags=model_tags, model_type="dvc-reference",
            experiment_id=client.get_run(run_id).info.experiment_id,
        ).model_id
    if reference is not None:
        _log_reference(client, model_id, reference)
    version = mlflow.register_model(f"models:/{model_id}", registered_model, tags=version_tags)
    return str(version.version)


def _log_reference(client: Any, model_id: str, reference: Mapping[str, Any]) -> None:
    import tempfile

    record = {key: value for key, value in reference.items() if key != "dvc_file"}
    with tempfile.TemporaryDirectory() as scratch:
        Path(scratch, REFERENCE_ARTIFACT).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        if reference.get("dvc_file"):
            Path(scratch, POINTER_ARTIFACT).write_text(str(reference["dvc_file"]))
        client.log_model_artifacts(model_id, scratch)


def model_reference(registered_model: str, version_or_alias: str) -> dict[str, Any]:
    """The DVC reference (``reference.json``) of a registered version, by number or alias, with its
    pointer file's text as ``dvc_file``: what ``DvcWorkspace.restore`` takes to bring the weights back."""
    import tempfile

    mlflow = _mlflow()
    selector = str(version_or_alias)
    uri = f"models:/{registered_model}/{selector}" if selector.isdigit() else f"models:/{registered_model}@{selector}"
    with tempfile.TemporaryDirectory() as scratch:
        try:
            path = Path(mlflow.artifacts.download_artifacts(f"{uri}/{REFERENCE_ARTIFACT}", dst_path=scratch))
        except OSError as error:
            raise FileNotFoundError(f"{uri} has no {REFERENCE_ARTIFACT}: it was registered without a DVC reference") from error
        record = json.loads(path.read_text())
        pointer = Path(mlflow.artifacts.download_artifacts(f"{uri}/{POINTER_ARTIFACT}", dst_path=scratch))
        record["dvc_file"] = pointer.read_text()
    return record


def set_alias(registered_model: str, alias: str, version: str) -> None:
    _mlflow().MlflowClient().set_registered_model_alias(registered_model, alias, str(version))


def get_alias(registered_model: str, alias: str) -> str | None:
    """The version behind ``alias``, or None when the alias or the registered model does not exist."""
    mlflow = _mlflow()
    from mlflow.exceptions import MlflowException

    try:
        return str(mlflow.MlflowClient().get_model_version_by_alias(registered_model, alias).version)
    except MlflowException as err:
        absent_model = err.error_code == "RESOURCE_DOES_NOT_EXIST"
        # a missing alias is INVALID_PARAMETER_VALUE, the same code as a malformed alias name
        absent_alias = err.error_code == "INVALID_PARAMETER_VALUE" and "not found" in str(err)
        if absent_model or absent_alias:
            return None
        raise


def model_version_tags(registered_model: str, version: str) -> dict[str, str]:
    return dict(_mlflow().MlflowClient().get_model_version(registered_model, str(version)).tags)


def describe_model_version(registered_model: str, version: str, description: str) -> None:
    """Set a version's description (what the registry page shows first); setting it again is harmless."""
    _mlflow().MlflowClient().update_model_version(registered_model, str(version), description=description)


def model_version_description(registered_model: str, version: str) -> str:
    return _mlflow().MlflowClient().get_model_version(registered_model, str(version)).description or ""


def find_model_version(registered_model: str, tags: Mapping[str, str]) -> str | None:
    """The newest version of ``registered_model`` whose tags include ``tags``; None if there is none."""
    mlflow = _mlflow()
    client = mlflow.MlflowClient()
    try:
        versions = client.search_model_versions(f"name = {quoted(registered_model)}")
    except mlflow.exceptions.MlflowException:
        return None
    matching = [v for v in versions if all(v.tags.get(key) == str(value) for key, value in tags.items())]
    return str(max(int(v.version) for v in matching)) if matching else None


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
