"""Stage tasks on Ray, through prefect-ray's RayTaskRunner, when params.yaml says ``execution.backend: ray``.

The flows call every stage through :func:`stage_runner`. With ``execution.backend: local`` (the
default) it calls the stage task directly, in the flow process, exactly as before. With ``ray`` it
enters a ``RayTaskRunner`` on ``execution.ray.address`` (empty: prefect-ray starts a local Ray for
the flow run) and submits each stage task to it, one at a time, waiting for its result: the flow
process keeps the workspace lock and the DVC/MLflow bookkeeping around the stages, and a stage runs
in a Ray worker process (on a cluster: any node, reading the workspace by its absolute path on a
shared filesystem). The stages themselves then start their own Ray actors and tasks for their
shards on the same cluster (closedloop.execution), through the connection the runner made.

Resources, so that a cluster can be sized for it: a stage task asks for Ray's default (1 CPU), the
warm start for ``execution.ray.train_num_cpus`` / ``train_num_gpus`` (it trains in its own
process). While a stage task runs, its sample and reward actors (``execution.ray.workers`` x
``num_cpus``, and ``num_gpus`` for sampling) or the train stage's own Ray task (``train_num_cpus`` /
``train_num_gpus``) run beside it. Ray lends the CPUs of a task blocked in ``ray.get`` to the work
it waits for, but not its GPUs: that is why the train stage's task asks for no GPU itself (it would
hold the GPU its training task then waits for, forever, on a one-GPU cluster). Give a cluster the
CPUs for a stage task and its actors together to avoid oversubscribing them.

Pitfalls handled here (prefect 3.9, prefect-ray 0.6, ray 2.60):
- the flow's Prefect API must reach the workers: prefect-ray forwards the flow's explicitly set
  settings, but not the URL of the ephemeral API server Prefect starts when PREFECT_API_URL is
  unset; without it each worker would start an API server of its own on the same database. The URL
  goes to the workers in the runtime environment of the Ray job (``init_kwargs``);
- the runner reuses a Ray connection it finds (``ray.is_initialized()``) and then applies none of its
  ``init_kwargs``: nothing here calls ``ray.init`` beside it; nested flows (the loop's warm start
  and iterations) share the connection their parent's runner made;
- the runner's ``address="auto"`` would start a local Ray when none is found: "auto" is passed to
  ``ray.init`` itself, which then fails instead;
- a stage task's logs do not reach Prefect from a Ray worker; its printed lines reach the flow's
  console through Ray's log forwarding;
- a task run's states reach the API as events, which the worker's events client sends from a thread
  of its own, later; when the runner exits it shuts its Ray connection down and the job's workers are
  killed, with the last events unsent under load (a CI run saw a task run that never appeared in
  the API). :class:`FlushingRayTaskRunner` has each task send its events before it returns.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, Callable, Iterator

from closedloop.config import Params
from closedloop.execution.base import ExecutionError
from closedloop.execution.ray_backend import check_reachable
from closedloop.faults import fault_env
from tasks import stages

# Stages that train a model in the stage task's own process. The others hand their model work to
# the executor (sampling and evaluation shards on actors; the train stage to a Ray task of its own
# with execution.ray.train_num_cpus / train_num_gpus).
TRAINS_IN_TASK = frozenset({"warmstart"})

StageCall = Callable[[str, str, Params, bool], dict]


def _direct(name: str, workspace: str, params: Params, progress: bool) -> dict:
    """execution.backend local: the stage task called in the flow process, as the flows always did."""
    return stages.STAGE_TASKS[name](workspace, params, progress)


def prefect_api_url() -> str:
    """The Prefect API this process talks to: PREFECT_API_URL, else the ephemeral server Prefect
    started for it (whose URL is in no setting or environment variable)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return str(url)
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is not None and context.client is not None:  # the client of this flow run
        return str(context.client.api_url).rstrip("/")
    # Outside a flow run: this process's one ephemeral server (SubprocessASGIServer is a singleton).
    with get_client(sync_client=True) as client:
        return str(client.api_url).rstrip("/")


def worker_env() -> dict[str, str]:
    """Environment variables every Ray worker of the flow run gets."""

    env = fault_env()  # tests' fault points
    env["PREFECT_API_URL"] = prefect_api_url()
    return env


# How long a task waits in its Ray worker for its events to be sent: a minute more on an unreachable API.
EVENTS_FLUSH_TIMEOUT_S = 60.0


@cache  # one class for the process: made on first use, so prefect_ray is imported only then
def _flushing_runner_class():
    """prefect-ray's RayTaskRunner whose remote function, after the task engine finishes, waits for
    the worker's Prefect events (the task run's states) to be sent (see the module's docstring)."""
    from prefect_ray import RayTaskRunner

    class FlushingRayTaskRunner(RayTaskRunner):
        @staticmethod
        def _run_prefect_task(*upstream_ray_obj_refs: Any, **kwargs: Any) -> Any:
            from prefect.events.worker import EventsWorker

            try:
                return RayTaskRunner._run_prefect_task(*upstream_ray_obj_refs, **kwargs)
            finally:
                EventsWorker.drain_all(timeout=EVENTS_FLUSH_TIMEOUT_S, at_exit=False)

    return FlushingRayTaskRunner


def ray_task_runner(params: Params):
    """prefect-ray's RayTaskRunner on ``execution.ray.address`` (empty: a local Ray for the run), its
    tasks' events sent before each returns."""
    address = params.execution.ray.address
    init_kwargs: dict[str, Any] = {"runtime_env": {"env_vars": worker_env()}, "logging_level": "warning"}
    if address == "auto":  # the runner would start a local Ray when none is found; ray.init fails
        init_kwargs["address"], address = "auto", None
    elif not address:
        init_kwargs["include_dashboard"] = False  # the Ray it starts: no dashboard process
    return _flushing_runner_class()(address=address or None, init_kwargs=init_kwargs)


def remote_options_for(name: str, params: Params) -> dict[str, Any]:
    """What a stage task asks Ray for (see the module's docstring)."""
    ray = params.execution.ray
    # No Ray retry of a lost stage task (Ray's default is 3): a stage holds DVC's lock and writes the
    # workspace; the flow fails instead, and the next run resumes it, doing only what is missing.
    options: dict[str, Any] = {"max_retries": 0}
    if name in TRAINS_IN_TASK:
        options.update(num_cpus=ray.train_num_cpus, num_gpus=ray.train_num_gpus)
    return options


@contextmanager
def _entered(runner, address: str) -> Iterator[Any]:
    check_reachable(address)  # fails in seconds naming the key; ray.init retries for minutes
    try:
        runner.__enter__()
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise ExecutionError(f"execution.ray.address {address or '(empty: a local Ray)'}: could not connect "
                             f"to Ray: {error}") from None
    try:
        yield runner
    finally:
        runner.__exit__(None, None, None)


@contextmanager
def stage_runner(params: Params) -> Iterator[StageCall]:
    """A function ``run(name, workspace, params, progress) -> metrics`` that runs one stage task where
    ``params.execution.backend`` says; with ray, for as long as the block lasts."""
    if params.execution.backend != "ray":
        yield _direct
        return
    from prefect_ray.context import remote_options

    with _entered(ray_task_runner(params), params.execution.ray.address) as runner:
        def on_ray(name: str, workspace: str, params: Params, progress: bool) -> dict:
            parameters = {"workspace": str(Path(workspace).resolve()), "params": params, "progress": progress}
            with remote_options(**remote_options_for(name, params)):
                future = runner.submit(stages.STAGE_TASKS[name], parameters)
            return future.result()

        yield on_ray
