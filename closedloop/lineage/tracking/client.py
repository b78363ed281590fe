"""The MLflow client this adapter drives: the store's URI, the experiment, MLflow's limits and the
names every run and version uses. mlflow is imported inside :func:`_mlflow`, never at module level."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ITERATION_TAG = "closedloop.iteration"


MODEL_ARTIFACT = "model"


REFERENCE_ARTIFACT = "reference.json"


POINTER_ARTIFACT = "weights.dvc"


WEIGHTS_TAG = "closedloop.weights"  # on the LoggedModel: "dvc" (by reference) or "mlflow" (logged in full)


HIST_ARTIFACT = "plots/reward_hist.png"


# MLflow's own limits (mlflow.utils.validation); params beyond them would be refused or cut silently.
_MAX_PARAM_VALUE = 6000


_MAX_PARAMS_PER_BATCH = 100


_MAX_METRICS_PER_BATCH = 1000


_TRUNCATED = "...[truncated]"


_END_STATUSES = ("FINISHED", "FAILED", "KILLED")


# The packages a served model needs; pinned to what logged it. Passed explicitly because the
# flavor's inferred defaults add torchvision for torch models, which is not installed here.
_MODEL_PACKAGES = ("mlflow", "transformers", "torch", "tokenizers", "safetensors", "accelerate")


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


def tracking_uri(workspace: Path, uri: str | None) -> str:
    """MLFLOW_TRACKING_URI > ``uri`` > a SQLite store inside the workspace."""
    return os.environ.get("MLFLOW_TRACKING_URI") or uri or f"sqlite:///{Path(workspace).resolve() / 'mlflow.db'}"


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


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _quoted(value: str) -> str:
    return "'" + str(value).replace("'", "\\'") + "'"
