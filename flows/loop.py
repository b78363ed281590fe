"""The closed loop: warm start once (iteration 0), then N iterations, each a subflow."""

from __future__ import annotations

from typing import Optional

from prefect import flow

from closedloop.config import Params, load_params, write_params
from closedloop.lineage.record import has_champion
from closedloop.workspace import Workspace
from flows.iteration import iteration_flow
from tasks import lineage, stages


@flow(name="closedloop-warm-start", log_prints=True)
def warm_start_flow(params: Optional[Params] = None, workspace: str = ".", progress: bool = False) -> dict:
    """Iteration 0: the fixed benchmark, the SFT'd base policy, registered as the first champion."""
    params = params or load_params(workspace)
    write_params(workspace, params)
    stages.benchmark(workspace, params, progress)
    metrics = stages.warmstart(workspace, params, progress)
    lineage.close_loop(workspace)
    lineage.push(workspace, params)
    version = lineage.register_warm_start(workspace, params)
    return {"model_version": version, "benchmark_pass@1": metrics["benchmark_pass@1"]}


@flow(name="closedloop", log_prints=True)
def closed_loop(iterations: int = 2, params: Optional[Params] = None, workspace: str = ".",
                progress: bool = False) -> dict:
    """Run the warm start if the workspace has no champion yet, then ``iterations`` iterations."""
    params = params or load_params(workspace)
    warm = None
    if not has_champion(Workspace.at(workspace)):
        warm = warm_start_flow(params, workspace, progress)
    # Each iteration numbers itself from the workspace (params.yaml's loop.iteration + 1).
    results = [iteration_flow(params, workspace, progress) for _ in range(iterations)]
    return {"warm_start": warm, "iterations": results}
