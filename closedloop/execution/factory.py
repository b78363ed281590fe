"""The executor ``execution.backend`` names. Stages take it from here and never branch on the name."""

from __future__ import annotations

from typing import Any

from closedloop.execution.base import Executor, Resources, load

# Imported on first use: Ray loads only when params.yaml asks for it.
EXECUTORS = {
    "local": "closedloop.execution.local:LocalExecutor",
    "ray": "closedloop.execution.ray_backend:RayExecutor",
}


def open_executor(params: Any) -> Executor:
    """The executor for ``params`` (a context manager: close it when the stage is done)."""

    cls = load(EXECUTORS[params.execution.backend])
    return cls() if params.execution.backend == "local" else cls(params)


def shard_resources(params: Any, gpus: bool = True) -> Resources:
    """What a sampling (``gpus``) or reward (no GPUs) actor asks for."""
    ray = params.execution.ray
    return Resources(num_cpus=ray.num_cpus, num_gpus=ray.num_gpus if gpus else 0.0)


def train_resources(params: Any) -> Resources:
    ray = params.execution.ray
    return Resources(num_cpus=ray.train_num_cpus, num_gpus=ray.train_num_gpus)
