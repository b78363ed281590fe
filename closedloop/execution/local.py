"""The local executor: today's processes. One worker in the stage's own process runs the shards in
order (its sandbox pools are the parallelism), so ``execution.backend: local`` costs nothing over
calling the worker directly."""

from __future__ import annotations

from typing import Any, Sequence

from closedloop.execution.base import Pooled, Resources, load


class LocalPool(Pooled):
    def __init__(self, worker: str, setup: dict) -> None:
        self._worker = load(worker)(setup)

    def map(self, shards: Sequence[dict]) -> list[Any]:
        return [self._worker.run(shard) for shard in shards]

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()


class LocalExecutor(Pooled):
    backend = "local"

    def pool(self, worker: str, setup: dict, resources: Resources | None = None) -> LocalPool:
        return LocalPool(worker, setup)

    def worker_cpus(self, resources: Resources | None = None) -> int | None:
        return None  # the stage's process has the whole machine

    def describe_call(self, resources: Resources) -> str:
        return "local"

    def call(self, function: str, payload: dict, resources: Resources | None = None) -> Any:
        return load(function)(payload)

    def close(self) -> None:
        pass
