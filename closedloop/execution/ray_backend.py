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
    """What runs in each actor: the stage's worker object, built once, fed shards."""

    def __init__(self, worker: str, setup: dict) -> None:
        self.kind = worker.rpartition(":")[2]
        self.worker = load(worker)(setup)

    def run(self, shard: dict, index: int) -> Any:
        result = self.worker.run(shard)
        kill_worker_once(f"shard:{self.kind}:{index}")  # tests: the work done, the result lost
        return result

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        self.worker.close()


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


class RayPool(Pooled):
    def __init__(self, worker: str, setup: dict, resources: Resources, workers: int, retries: int) -> None:
        import ray

        actor_class = ray.remote(ShardActor).options(
            num_cpus=resources.num_cpus, num_gpus=resources.num_gpus, max_restarts=retries,
            max_task_retries=retries, runtime_env=_runtime_env() or None)
        self._ray = ray
        self._worker = worker
        self._actors = [actor_class.remote(worker, setup) for _ in range(workers)]
        try:
            ray.get([actor.ready.remote() for actor in self._actors])
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
        return RayPool(worker, setup, resources, self.settings.workers, self.settings.retries)

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
