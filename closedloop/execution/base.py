"""The executor seam: worker pools over ordered shards of plain records, and single calls.

A *worker* is a class named by its dotted path (``"package.module:Class"``), so that it can be built
where the shard runs (a Ray actor on another machine imports it there). It is constructed once per
process with a plain ``setup`` dict, then ``run(shard)`` is called for each shard it is given, and
``close()`` at the end. Workers hold what is expensive to start (a model, sandbox pools) across shards.

Shards must be pure: the same shard gives the same result wherever and however often it runs. That
is what makes a lost worker's shard safe to run again, and the results independent of the backend.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence


@dataclass(frozen=True)
class Resources:
    """What one worker (or one call) asks the cluster for. The local backend ignores it."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0


class WorkerPool(Protocol):
    def map(self, shards: Sequence[dict]) -> list[Any]:
        """Every shard's result, in the shards' order."""

    def close(self) -> None:
        ...


class Executor(Protocol):
    backend: str

    def pool(self, worker: str, setup: dict, resources: Resources | None = None) -> WorkerPool:
        """Workers of class ``worker`` built from ``setup``; close the pool when done (a context manager)."""

    def worker_cpus(self, resources: Resources | None = None) -> int | None:
        """The cores one worker may use (None: the whole machine, as in the stage's own process)."""

    def describe_call(self, resources: Resources) -> str:
        """Where :meth:`call` runs with ``resources``, in words (the stage's info file says it)."""

    def call(self, function: str, payload: dict, resources: Resources | None = None) -> Any:
        """``function(payload)`` where resources allow (the train stage on a GPU worker)."""

    def close(self) -> None:
        ...


class ExecutionError(RuntimeError):
    """A shard failed where it ran; the message names the shard and carries the worker's own error."""


def load(dotted: str) -> Callable[..., Any]:
    """The object ``package.module:name`` names."""
    module, _, name = dotted.partition(":")
    if not module or not name:
        raise ValueError(f"{dotted!r}: expected 'package.module:name'")
    return getattr(importlib.import_module(module), name)


def split(count: int, shards: int, unit: int = 1) -> list[range]:
    """``range(count)`` cut into at most ``shards`` contiguous, non-empty ranges of near-equal size
    whose boundaries fall on multiples of ``unit`` (a sampler's batch: rows decoded together must stay
    together for the samples not to depend on the sharding)."""
    if shards < 1 or unit < 1:
        raise ValueError(f"shards ({shards}) and unit ({unit}) must be >= 1")
    units = -(-count // unit)  # ceil
    shards = min(shards, units) or 1
    bounds = [min(count, (units * i // shards) * unit) for i in range(shards + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class Pooled:
    """Context-manager plumbing every pool shares."""

    def close(self) -> None:  # pragma: no cover - overridden
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
