"""The closed loop: warm start once (iteration 0), then N iterations, each a subflow."""

from __future__ import annotations

from typing import Optional

from prefect import flow

from closedloop.config import Params, write_params
from closedloop.io import read_json, say
from closedloop.pipeline import WARM_START_STAGES
from closedloop.progress import Progress, read_progress, write_progress
from closedloop.runlock import workspace_lock
from closedloop.versioning.loop import has_champion
from closedloop.workspace import Workspace
from flows.hooks import flow_run_id, flow_run_ids, on_interrupted
from flows.iteration import iteration_flow
from flows.params import workspace_params
from flows.ray_runner import stage_runner
from tasks import lineage


def needs_warm_start(workspace: str) -> bool:
    """No champion yet, or a warm start that a killed run left unregistered."""
    progress = read_progress(Workspace.at(workspace).root)
    unfinished = progress is not None and progress.iteration == 0 and progress.state != "done"
    return unfinished or not has_champion(Workspace.at(workspace))


@flow(name="closedloop-warm-start", log_prints=True, on_cancellation=[on_interrupted], on_crashed=[on_interrupted])
def warm_start_flow(params: Optional[Params] = None, workspace: str = ".", progress: bool = False) -> dict:
    """Iteration 0: the fixed benchmark, the SFT'd base policy, registered as the first champion.

    Args:
        params: Settings for this run, laid over the workspace's params.yaml: only what you change
            here overrides the file, and the result is validated and written to params.yaml.
        workspace: The closedloop workspace (a directory made by `closedloop init`).
        progress: Show progress bars in the logs.
    """
    with workspace_lock(workspace, wait=True, command="closedloop-warm-start flow", flow_run_id=flow_run_id()):
        lineage.recover_git_state(workspace)  # before anything reads params.yaml
        params = workspace_params(workspace, params)
        root = Workspace.at(workspace).root
        record = read_progress(root)
        if record is None or record.iteration != 0 or record.state == "done":
            record = Progress(iteration=0)
        else:
            record.attempts += 1
            record.state = "running"
        record.flow_run_ids = flow_run_ids()
        write_progress(root, record)
        write_params(workspace, params)
        lineage.preflight(workspace, params, warm_start=True)
        metrics = {}
        with stage_runner(params) as run_stage:  # local: in this process; ray: flows/ray_runner.py
            for name in WARM_START_STAGES:
                # DVC's verdict decides, as for `dvc repro`: a warm start killed after its SFT keeps it.
                if lineage.stage_done(workspace, name):
                    say(f"closedloop: resume: stage {name} already done (its outputs match dvc.lock); not run again")
                    continue
                lineage.note_stage(workspace, name, done=False)
                metrics = run_stage(name, workspace, params, progress)
                lineage.note_stage(workspace, name, done=True)
        lineage.close_loop(workspace)
        lineage.push(workspace, params)
        version = lineage.register_warm_start(workspace, params)
        lineage.finish_iteration(workspace)

        summary = read_json(Workspace.at(workspace).warmstart_eval)["summary"]
        return {"model_version": version, "benchmark_pass@1": metrics.get("benchmark_pass@1",
                                                                           summary["overall"]["pass@1"])}


@flow(name="closedloop", log_prints=True)
def closed_loop(iterations: int = 2, params: Optional[Params] = None, workspace: str = ".",
                progress: bool = False) -> dict:
    """Run the warm start if the workspace has no champion yet, then ``iterations`` iterations.

    An iteration a killed or cancelled run left unfinished is continued first, and counts as one.

    Args:
        iterations: Closed-loop iterations to run after the warm start (0: the warm start only).
        params: Settings for this run, laid over the workspace's params.yaml: only what you change
            here overrides the file (a partial {"train": {"steps": 12}} is fine), and the result is
            validated and written to params.yaml before the first stage.
        workspace: The closedloop workspace (a directory made by `closedloop init`).
        progress: Show progress bars in the logs.
    """
    with workspace_lock(workspace, wait=True, command="closedloop flow", flow_run_id=flow_run_id()):
        lineage.recover_git_state(workspace)  # before anything reads params.yaml or data/champion.dvc
        params = workspace_params(workspace, params)  # a bad override fails here, before anything is written
        warm = None
        # execution.backend ray: one connection to the cluster for the warm start and every iteration
        # (their own runners reuse it); local: nothing.
        with stage_runner(params):
            if needs_warm_start(workspace):
                warm = warm_start_flow(params, workspace, progress)
            # Each iteration numbers itself from the workspace (params.yaml's loop.iteration + 1).
            results = [iteration_flow(params, workspace, progress) for _ in range(iterations)]
        return {"warm_start": warm, "iterations": results}
