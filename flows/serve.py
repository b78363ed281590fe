"""Serve the flows as deployments, so a user can trigger and parameterise runs from the Prefect UI."""

from __future__ import annotations

from pathlib import Path

from prefect import serve as prefect_serve

from closedloop.config import load_params
from closedloop.pipeline import FLOW_STEPS, ITERATION_STAGES
from flows.iteration import iteration_flow
from flows.loop import closed_loop, warm_start_flow
from flows.review import review_flow


def deployments(workspace: str) -> list:
    """The Params model is a flow parameter, so each deployment's form has one field per setting,
    filled with the workspace's params.yaml as it is when `closedloop serve` starts. A run changes
    only what its form or API call changed from that (flows.params): the rest is the file as it is
    when the run starts.

    The entrypoint is the flow's module path (flows.iteration.iteration_flow), not a file path
    relative to the directory serve started in, so the deployment runs from any directory.

    One run at a time per loop deployment, the others queued (ENQUEUE) rather than refused: two clicks
    on "Run" give two iterations one after the other. The review deployment has no limit: reviews run
    beside an iteration and beside each other. Across deployments of one workspace, the flows
    themselves wait for the workspace lock (closedloop.runlock), so they queue too."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.types.entrypoint import EntrypointType

    root = str(Path(workspace).resolve())
    common = {"workspace": root, "params": load_params(root).model_dump(mode="json")}
    one_at_a_time = {"concurrency_limit": ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
        "entrypoint_type": EntrypointType.MODULE_PATH}
    return [
        closed_loop.to_deployment(name="closed-loop", parameters={**common, "iterations": 1}, **one_at_a_time,
                                  description="Warm start if needed, then N closed-loop iterations."),
        iteration_flow.to_deployment(name="iteration", parameters=common, **one_at_a_time,
                                     description="One iteration: " + " → ".join((*ITERATION_STAGES, "version")) + "."
                                     + "".join(f" {step.name.capitalize()} before {step.before} when {step.when}."
                                               for step in FLOW_STEPS)),
        warm_start_flow.to_deployment(name="warm-start", parameters=common, **one_at_a_time,
                                      description="Iteration 0: benchmark set and the SFT'd base policy."),
        # No lock and no queue: a review only reads the review sample and appends to the inbox, so
        # people can answer while an iteration runs.
        review_flow.to_deployment(name="review", parameters={"workspace": root},
                                  entrypoint_type=EntrypointType.MODULE_PATH,
                                  description="Score the last iteration's review sample in a form; the answers "
                                  "become the next iteration's human reward component."),
    ]


def serve(workspace: str) -> None:
    prefect_serve(*deployments(workspace))
