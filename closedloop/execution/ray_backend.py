"""The Ray executor: shards on Ray actors (one worker object per actor, built there), calls as Ray
tasks, on the cluster ``execution.ray.address`` names.

Ray itself does the recovery: actors are created with ``max_restarts`` and ``max_task_retries`` of
``execution.ray.retries``, so a shard whose actor died (killed, OOM, node lost) is run again on the
restarted actor; shards are pure and their results come back to the stage, which writes each output
once. Inside a prefect-ray ``RayTaskRunner`` task the process is already connected to the flow's
cluster: the executor uses that connection and never calls ``ray.init()`` beside it.
"""

from __future__ import annotations

from typing import Any, Sequence

from closedloop.execution.base import ExecutionError, Pooled, Resources, load
from closedloop.faults import fault_env, kill_worker_once


class ShardActor:
    """What runs in each actor: the stage's worker object, built once, fed shards.

    Building the worker (a sampler loads its model) is not part of the actor's start: ``ready``
    answers as soon as the actor is placed and its process runs, which is what the placement deadline
    waits for; ``start`` then builds the worker, however long a loaded machine takes. An actor Ray
    restarts after losing it builds its worker again on its first shard."""

    def __init__(self, worker: str, setup: dict) -> None:
        self.kind = worker.rpartition(":")[2]
        self._entry, self._setup = worker, setup
        self._worker: Any = None

    def _built(self) -> Any:
        if self._worker is None:
            self._worker = load(self._entry)(self._setup)
        return self._worker

    def run(self, shard: dict, index: int) -> Any:
        result = self._built().run(shard)
        kill_worker_once(f"shard:{self.kind}:{index}")  # tests: the work done, the result lost
        return result

    def ready(self) -> bool:
        return True

    def start(self) -> bool:
        self._built()
        return True

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


def call_function(function: str, payload: dict) -> Any:
    return load(function)(payload)


def _unwrapped(error: Exception) -> Exception:
    """The worker's own exception out of Ray's wrapper (its message names the file or key)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, Exception) else error


def _runtime_env() -> dict:
    # Fault points reach workers of a cluster started elsewhere (tests); unset, nothing is passed.
    env = fault_env()
    return {"env_vars": env} if env else {}


def in_ray_task() -> bool:
    """Whether this process is a Ray worker running a task or actor (for instance the train stage as a
    prefect-ray task). Reads sys.modules first, so a process that never imported Ray never imports it."""
    import sys

    if "ray" not in sys.modules:
        return False
    from ray._private import worker

    return worker.global_worker.mode == worker.WORKER_MODE


def check_reachable(address: str) -> None:
    """Fail in seconds, naming the key, when the cluster's port does not answer: ray.init itself
    retries an unreachable head for minutes."""
    import socket

    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # empty (a local Ray), "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise ExecutionError(f"execution.ray.address {address}: nothing answers there ({error}); start the "
                             "cluster (`ray start --head`) or fix the address") from None


def fitting_workers(wanted: int, num_cpus: float, num_gpus: float, available: dict) -> int:
    """How many of ``wanted`` actors of ``num_cpus`` / ``num_gpus`` each the free resources hold (at
    least one: a cluster too busy for one gets the placement deadline, which names what is missing)."""
    fits = [wanted]
    if num_cpus > 0:
        fits.append(int(available.get("CPU", 0.0) // num_cpus))
    if num_gpus > 0:
        fits.append(int(available.get("GPU", 0.0) // num_gpus))
    return max(1, min(fits))


class RayPool(Pooled):
    """``workers`` actors of one worker kind, fewer where the cluster's free resources hold fewer: a
    stage's pools start in turn on a small cluster (a 2-CPU local Ray) instead of waiting on each
    other. An actor that is not placed (its process running) within ``placement_timeout_s`` fails the
    pool, naming what it asked for and what the cluster has; the workers are built after that, with no
    deadline (a model loading on a loaded machine is slow, not misplaced)."""

    def __init__(self, worker: str, setup: dict, resources: Resources, workers: int, retries: int,
                 placement_timeout_s: float = 120.0) -> None:
        import ray

        actor_class = ray.remote(ShardActor).options(
            num_cpus=resources.num_cpus, num_gpus=resources.num_gpus, max_restarts=retries,
            max_task_retries=retries, runtime_env=_runtime_env() or None)
        self._ray = ray
        self._worker = worker
        count = fitting_workers(workers, resources.num_cpus, resources.num_gpus, _free_while_waiting(ray))
        self._actors = [actor_class.remote(worker, setup) for _ in range(count)]
        try:
            pending = [actor.ready.remote() for actor in self._actors]
            _, waiting = ray.wait(pending, num_returns=len(pending), timeout=placement_timeout_s)
            if waiting:
                # An actor never placed cannot run close(): waiting for it would add close()'s whole
                # timeout to the failure. Those go at once; the placed ones close as usual.
                placed = []
                for ref, actor in zip(pending, self._actors):
                    if ref in waiting:
                        ray.kill(actor)
                    else:
                        placed.append(actor)
                self._actors = placed
                raise ExecutionError(
                    f"{len(waiting)} of {count} Ray actors for {worker} (each asking for {resources.num_cpus:g} CPU, "
                    f"{resources.num_gpus:g} GPU) were not placed within {placement_timeout_s:g} s "
                    f"(execution.ray.placement_timeout_s); the cluster has {_resources(ray.cluster_resources())} "
                    f"in all, {_resources(ray.available_resources())} free. Lower execution.ray.num_cpus / "
                    "num_gpus or execution.ray.workers, or give the cluster more")
            ray.get(pending)
            ray.get([actor.start.remote() for actor in self._actors])  # the workers built: no deadline
        except Exception as error:
            self.close()
            raise _unwrapped(error) from None

    def map(self, shards: Sequence[dict]) -> list[Any]:
        from ray.exceptions import RayActorError, RayTaskError
        from ray.util import ActorPool

        pool = ActorPool(self._actors)
        indexed = list(enumerate(shards))
        try:
            return list(pool.map(lambda actor, item: actor.run.remote(item[1], item[0]), indexed))
        except RayTaskError as error:
            raise _unwrapped(error) from None
        except RayActorError as error:
            raise ExecutionError(f"a {self._worker} shard's Ray worker was lost more often than "
                                 f"execution.ray.retries allows: {error}") from None

    def close(self) -> None:
        actors, self._actors = self._actors, []
        if not actors:
            return
        try:
            self._ray.get([actor.close.remote() for actor in actors], timeout=60)
        except Exception:
            pass  # a worker that cannot close is killed below all the same
        for actor in actors:
            self._ray.kill(actor)


def _free_while_waiting(ray: Any) -> dict:
    """The cluster's free resources once this process blocks on its actors: inside a Ray task (a
    stage under prefect-ray) Ray lends the task's own CPUs to what it waits for."""
    free = dict(ray.available_resources())
    context = ray.get_runtime_context()
    if context.get_task_id() is not None:
        for name, amount in context.get_assigned_resources().items():
            if name == "CPU":
                free[name] = free.get(name, 0.0) + amount
    return free


def _resources(figures: dict) -> str:
    shown = {name: figures[name] for name in ("CPU", "GPU") if name in figures}
    return ", ".join(f"{value:g} {name}" for name, value in shown.items()) or "nothing"


class RayExecutor(Pooled):
    backend = "ray"

    def __init__(self, params: Any) -> None:
        import ray

        self.settings = params.execution.ray
        self._connected_here = False
        if not ray.is_initialized():
            check_reachable(self.settings.address)
            try:
                ray.init(address=self.settings.address or None, include_dashboard=False, logging_level="warning",
                         configure_logging=True, log_to_driver=True)
            except (ConnectionError, ValueError, RuntimeError) as error:
                raise ExecutionError(f"execution.ray.address {self.settings.address or '(empty: a local Ray)'}: "
                                     f"could not connect to Ray: {error}") from None
            self._connected_here = True
        self._ray = ray

    def pool(self, worker: str, setup: dict, resources: Resources | None = None) -> RayPool:
        resources = resources or Resources(self.settings.num_cpus, self.settings.num_gpus)
        return RayPool(worker, setup, resources, self.settings.workers, self.settings.retries,
                       self.settings.placement_timeout_s)

    def worker_cpus(self, resources: Resources | None = None) -> int | None:
        resources = resources or Resources(self.settings.num_cpus, self.settings.num_gpus)
        return max(1, int(resources.num_cpus))

    def describe_call(self, resources: Resources) -> str:
        return f"ray task ({resources.num_cpus:g} CPU, {resources.num_gpus:g} GPU)"

    def call(self, function: str, payload: dict, resources: Resources | None = None) -> Any:
        from ray.exceptions import RayTaskError

        resources = resources or Resources(self.settings.train_num_cpus, self.settings.train_num_gpus)
        remote = self._ray.remote(call_function).options(
            num_cpus=resources.num_cpus, num_gpus=resources.num_gpus, max_retries=self.settings.retries,
            runtime_env=_runtime_env() or None)
        try:
            return self._ray.get(remote.remote(function, payload))
        except RayTaskError as error:
            raise _unwrapped(error) from None

    def close(self) -> None:
        if self._connected_here and self._ray.is_initialized():
            self._ray.shutdown()
        self._connected_here = False
