"""The model registry: a version per candidate (a reference to its DVC-tracked weights, or the model in
full with ``tracking.log_weights``), its lineage tags and description, and the champion/challenger aliases."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from closedloop.lineage.tracking.client import (
    _MODEL_PACKAGES,
    MODEL_ARTIFACT,
    POINTER_ARTIFACT,
    REFERENCE_ARTIFACT,
    WEIGHTS_TAG,
    _mlflow,
    _quoted,
)


@contextlib.contextmanager
def _quiet_hf() -> Iterator[None]:
    """Silence hub look-ups that cannot succeed for a local model and per-save progress bars."""
    from transformers.utils import logging as hf_logging

    flavor_log = logging.getLogger("mlflow.transformers")  # "model card could not be retrieved", license
    level, bars = flavor_log.level, hf_logging.is_progress_bar_enabled()
    flavor_log.setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        flavor_log.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()


def _pip_requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for package in _MODEL_PACKAGES:
        try:
            pins.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    return pins


def _load_components(model_dir: Path, task: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    auto = {"text-generation": AutoModelForCausalLM, "text2text-generation": AutoModelForSeq2SeqLM}
    if task not in auto:
        raise ValueError(f"task {task!r} is not supported for registration; expected one of {sorted(auto)}")
    return {"model": auto[task].from_pretrained(model_dir), "tokenizer": AutoTokenizer.from_pretrained(model_dir)}


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
        with _quiet_hf():
            components = _load_components(model_dir, task)  # outside the run: a bad directory is not a failed run
            # reopening the iteration's run puts the model (and its LoggedModel) under it
            with mlflow.start_run(run_id=run_id):
                info = mlflow.transformers.log_model(
                    transformers_model=components,
                    name=MODEL_ARTIFACT,
                    task=task,
                    pip_requirements=_pip_requirements(),
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
        versions = client.search_model_versions(f"name = {_quoted(registered_model)}")
    except mlflow.exceptions.MlflowException:
        return None
    matching = [v for v in versions if all(v.tags.get(key) == str(value) for key, value in tags.items())]
    return str(max(int(v.version) for v in matching)) if matching else None
