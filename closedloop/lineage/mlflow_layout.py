"""The MLflow layout as plain data: the names every run and version uses, MLflow's own limits, how
params.yaml becomes run params, the tags that name an iteration's run, and the helpers the adapter's
records need (a model's pip requirements, the reward histogram). Nothing here imports mlflow: that is
lineage/tracking.py's alone."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ITERATION_TAG = "closedloop.iteration"


MODEL_ARTIFACT = "model"


REFERENCE_ARTIFACT = "reference.json"


POINTER_ARTIFACT = "weights.dvc"


WEIGHTS_TAG = "closedloop.weights"  # on the LoggedModel: "dvc" (by reference) or "mlflow" (logged in full)


HIST_ARTIFACT = "plots/reward_hist.png"


# MLflow's own limits (mlflow.utils.validation); params beyond them would be refused or cut silently.
MAX_PARAM_VALUE = 6000


MAX_PARAMS_PER_BATCH = 100


MAX_METRICS_PER_BATCH = 1000


TRUNCATED = "...[truncated]"


END_STATUSES = ("FINISHED", "FAILED", "KILLED")


# The packages a served model needs; pinned to what logged it. Passed explicitly because the
# flavor's inferred defaults add torchvision for torch models, which is not installed here.
MODEL_PACKAGES = ("mlflow", "transformers", "torch", "tokenizers", "safetensors", "accelerate")


@dataclass(frozen=True)
class DatasetInput:
    name: str
    path: str
    digest: str  # the DVC md5 of the file, so the MLflow input and the DVC pointer name the same bytes
    context: str  # e.g. "training", "evaluation"
    frame: Any  # pandas DataFrame (schema and row count go to MLflow, not the rows)


def tracking_uri(workspace: Path, uri: str | None) -> str:
    """MLFLOW_TRACKING_URI > ``uri`` > a SQLite store inside the workspace."""
    return os.environ.get("MLFLOW_TRACKING_URI") or uri or f"sqlite:///{Path(workspace).resolve() / 'mlflow.db'}"


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> {"a.b.c": "value"}; lists as JSON; values cut to MLflow's length limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, prefix=f"{name}."))
            continue
        text = json.dumps(value, default=str) if isinstance(value, (list, tuple, Mapping)) else str(value)
        if len(text) > MAX_PARAM_VALUE:
            text = text[: MAX_PARAM_VALUE - len(TRUNCATED)] + TRUNCATED
        flat[name] = text
    return flat


def run_key(workspace: Path | str, iteration: int, kind: str) -> dict[str, str]:
    """The tags that name an iteration's MLflow run: a rerun finds it by them."""
    return {"closedloop.iteration": str(iteration), "closedloop.kind": kind, "closedloop.workspace": str(workspace)}


def chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def now_ms() -> int:
    return int(time.time() * 1000)


def quoted(value: str) -> str:
    return "'" + str(value).replace("'", "\\'") + "'"


def pip_requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for package in MODEL_PACKAGES:
        try:
            pins.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    return pins


@contextlib.contextmanager
def quiet_hf() -> Iterator[None]:
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


def load_components(model_dir: Path, task: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    auto = {"text-generation": AutoModelForCausalLM, "text2text-generation": AutoModelForSeq2SeqLM}
    if task not in auto:
        raise ValueError(f"task {task!r} is not supported for registration; expected one of {sorted(auto)}")
    return {"model": auto[task].from_pretrained(model_dir), "tokenizer": AutoTokenizer.from_pretrained(model_dir)}


def reward_figure(rewards: list[float]) -> Any:
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
