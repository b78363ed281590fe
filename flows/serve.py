"""Serve the flows as deployments, so a user can trigger and parameterise runs from the Prefect UI."""

from __future__ import annotations

from prefect import serve as prefect_serve

from flows.iteration import iteration_flow
from flows.loop import closed_loop, warm_start_flow


def deployments(workspace: str) -> list:
    """The Params model is a flow parameter, so each deployment's form has one field per setting."""
    common = {"workspace": workspace}
    return [
        closed_loop.to_deployment(name="closed-loop", parameters={**common, "iterations": 1},
                                  description="Warm start if needed, then N closed-loop iterations."),
        iteration_flow.to_deployment(name="iteration", parameters=common,
                                     description="One iteration: sample → reward → grade → validate → train → "
                                     "evaluate → gate → promote → version."),
        warm_start_flow.to_deployment(name="warm-start", parameters=common,
                                      description="Iteration 0: benchmark set and the SFT'd base policy."),
    ]


def serve(workspace: str) -> None:
    prefect_serve(*deployments(workspace))
