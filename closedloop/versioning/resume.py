"""Beginning an iteration, or resuming one a run left unfinished, and following its stages in the
progress record: the bookkeeping that lets a run killed anywhere be finished by the next one."""

from __future__ import annotations

from closedloop.config import Params, write_params
from closedloop.io import say
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.preflight import check_tracking_store
from closedloop.lineage.preflight import preflight as check
from closedloop.pipeline import stage_spec
from closedloop.progress import Progress, read_progress, stage_completed, update_progress, write_progress
from closedloop.versioning.store import open_store
from closedloop.workspace import Workspace


def recover_git_state(ws: Workspace) -> list[str]:
    """First thing a run does once it holds the lock, before anything reads params.yaml or the
    progress record: a `dvc exp save` killed midway can leave those files reset or cut short."""
    notes = [f"cleaned after an interrupted `dvc exp save`: {what}"
             for what in DvcWorkspace(ws.root).clean_interrupted_git_state()]
    for note in notes:
        say(f"closedloop: {note}")
    return notes


def begin_iteration(ws: Workspace, params: Params, previous: Params,
                    flow_run_ids: list[str] | None = None) -> tuple[Params, Progress]:
    """The iteration this run works on, written to params.yaml (the stages read it from there).

    An iteration a run left unfinished (killed, cancelled, crashed, or failed other than by a refused
    batch; see closedloop.progress) is continued: same number, so the same seeds. Otherwise the next
    number. The progress record is written before params.yaml, so a kill between the two resumes the
    number the record names and no iteration number is ever skipped."""
    import shutil

    nxt = params.model_copy(deep=True)
    progress = read_progress(ws.root)
    last = previous.loop.iteration
    if progress is not None and progress.resumable() and progress.iteration in (last, last + 1) and progress.iteration:
        nxt.loop.iteration = progress.iteration
        progress.attempts += 1
        say(f"closedloop: resuming iteration {progress.iteration} (it was {progress.state}"
            + (f" at {progress.stage}" if progress.stage else "")
            + (f": {progress.reason}" if progress.reason else "") + f"; attempt {progress.attempts})")
        progress.state, progress.reason = "running", None
    else:
        nxt.loop.iteration = last + 1
        progress = Progress(iteration=nxt.loop.iteration)
        # A fresh iteration trains from its own start: a checkpoint an abandoned one left is not its own.
        stale = ws.candidate.with_name("candidate.checkpoint")
        if stale.exists():
            shutil.rmtree(stale)
            say(f"closedloop: removed {stale.relative_to(ws.root)}: a checkpoint of an earlier, abandoned "
                "iteration")
    progress.flow_run_ids = list(flow_run_ids or [])
    write_progress(ws.root, progress)
    if nxt.train.replay.last:
        # The batches replayed are the last N iterations' experiments, named in params.yaml so that
        # `dvc repro` of this iteration reads the same ones.
        nxt.train.replay.versions = replay_versions(ws, nxt) if params.versioning.save_experiments else []
    # The batches the monitors compare this one with, named the same way for the same reason.
    nxt.monitors.versions = (recent_experiments(ws, nxt.loop.iteration, nxt.monitors.history)
                             if params.versioning.save_experiments and nxt.monitors.enabled else [])
    write_params(ws.root, nxt)
    return nxt, progress


def replay_versions(ws: Workspace, params: Params) -> list[str]:
    """The experiments of iterations ``loop.iteration - train.replay.last`` .. ``loop.iteration - 1``,
    oldest first. Where an iteration was saved more than once (it was re-run), its newest save counts."""
    return recent_experiments(ws, params.loop.iteration, params.train.replay.last)


def recent_experiments(ws: Workspace, current: int, last: int) -> list[str]:
    """The experiments of iterations ``current - last`` .. ``current - 1`` (from 1), oldest first; an
    iteration saved more than once (re-run) counts by its newest save, one never saved is left out."""
    if last <= 0:
        return []
    newest = DvcWorkspace(ws.root).iteration_experiments()
    return [newest[i] for i in range(max(1, current - last), current) if i in newest]


def end_interrupted_runs(ws: Workspace, params: Params) -> list[str]:
    """End as KILLED the runs of this workspace a killed process left RUNNING (we hold the lock)."""
    tracking = open_store(ws, params)
    return tracking.end_interrupted_runs(params.tracking.experiment, {"closedloop.workspace": str(ws.root)},
                                         "its process ended before the run did; a later run resumed the iteration")


def preflight(ws: Workspace, params: Params, warm_start: bool = False) -> list[str]:
    """Before the first stage: check that what the iteration reads is present and intact (repairing
    it from the remote where possible; see lineage/preflight.py), and end the MLflow runs killed
    processes left RUNNING. Returns (and prints) what it did; raises PreflightError naming every
    problem it could not repair. (The git state a killed `dvc exp save` left is cleaned earlier, when
    the run takes the lock: recover_git_state.)"""

    # The warm start has no benchmark or champion yet to check, but records into the same store.
    notes = check_tracking_store(ws.root, params) if warm_start else check(ws.root, params)
    ended = end_interrupted_runs(ws, params)
    if ended:
        notes.append(f"ended {len(ended)} MLflow run(s) a killed run left RUNNING as KILLED: {', '.join(ended)}")
    for note in notes:
        say(f"closedloop: {note}")
    return notes


def stage_done(ws: Workspace, stage: str) -> bool:
    """DVC's own verdict: the stage's recorded deps, params and outs all match the workspace."""
    done = DvcWorkspace(ws.root).stage_up_to_date(stage)
    if done:
        note_stage(ws, stage, done=True)  # recorded with its output hashes, as a stage that just ran
    return done


def note_stage(ws: Workspace, stage: str, done: bool) -> None:
    """The progress record follows the stages: which one runs, and each one's recorded outputs."""

    if not done:
        update_progress(ws.root, stage=stage)
        return
    hashes = DvcWorkspace(ws.root).lock_hashes()
    stage_completed(ws.root, stage, {out: hashes.get(out, "") for out in stage_spec(stage).outs})


def closed_loop_on(ws: Workspace, champion: str) -> None:
    """The progress record keeps the champion the iteration closed its loop on (close_loop's ``closed``)."""

    update_progress(ws.root, champion=champion)


def finish_iteration(ws: Workspace) -> None:
    update_progress(ws.root, state="done", stage=None, reason=None)
