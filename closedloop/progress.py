"""Where the current iteration stands, so a run killed anywhere continues it instead of starting over.

``.closedloop/iteration.json`` (local state, not versioned) says which iteration is under way, which
stages it has completed (with the DVC hashes of their outputs), which stage was running, and how it
ended: ``running`` (under way, or killed: nothing else can tell), ``failed``, ``cancelled``,
``crashed``, or ``done``. ``closedloop run`` reads it first: an iteration that is not done is
continued with the same number and seed; completed stages whose outputs still match dvc.lock are
skipped, and the version step finishes whatever part of it is missing.

The record is a hint for humans and for the order of work; what decides whether a stage runs again
is DVC's own stage status, and what decides whether a version part is done is the stores themselves
(the experiment ref, the MLflow run, the registry), so a record lost or stale costs time, not data.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from closedloop.io import BatchFileError, read_json, say, write_json

PROGRESS_FILE = ".closedloop/iteration.json"
UNFINISHED = ("running", "failed", "cancelled", "crashed")


@dataclass
class Progress:
    iteration: int
    state: str = "running"
    started: str = ""
    updated: str = ""
    stage: str | None = None  # the stage running, or the one that failed
    completed: dict[str, dict[str, str]] = field(default_factory=dict)  # stage -> {out path: md5}
    reason: str | None = None
    attempts: int = 1  # how many runs have worked on this iteration
    # A batch refused by validation is the iteration's verdict, not an accident: running it again
    # reads the same batch and is refused again, so the next run starts a new iteration.
    final: bool = False
    flow_run_ids: list[str] = field(default_factory=list)  # the flow run working on it, and its root
    champion: str | None = None  # the champion's fingerprint, once the iteration closed its loop on it
    # When the iteration's first attempt began (seconds since the epoch; ``started`` is the same moment
    # for people): its MLflow run starts here, so a run resumed twice still spans the whole iteration.
    started_at: float = 0.0

    def resumable(self) -> bool:
        return self.state in UNFINISHED and not self.final


def progress_path(root: Path) -> Path:
    return Path(root) / PROGRESS_FILE


def read_progress(root: Path) -> Progress | None:
    path = progress_path(root)
    if not path.exists():
        return None
    try:
        data = read_json(path)
        return Progress(**{key: data[key] for key in Progress.__dataclass_fields__ if key in data})
    except (BatchFileError, TypeError, KeyError) as error:
        # DVC's stage status still decides what runs again; the iteration number may move on
        say(f"closedloop: warning: {path} is unreadable ({error}); the next iteration starts afresh")
        return None


def write_progress(root: Path, progress: Progress) -> Progress:
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    progress.started = progress.started or now
    progress.started_at = progress.started_at or time.time()
    progress.updated = now
    write_json(progress_path(root), asdict(progress))
    return progress


def started_ms(progress: Progress | None) -> int | None:
    """When the iteration's first attempt began, in ms since the epoch (MLflow's unit); None without a
    record. A record written before ``started_at`` existed has the time to the second in ``started``."""
    if progress is None:
        return None
    if progress.started_at:
        return int(progress.started_at * 1000)
    try:
        from datetime import datetime

        return int(datetime.strptime(progress.started, "%Y-%m-%dT%H:%M:%S%z").timestamp() * 1000)
    except ValueError:
        return None


def update_progress(root: Path, **fields: Any) -> Progress | None:
    progress = read_progress(root)
    if progress is None:
        return None
    for key, value in fields.items():
        setattr(progress, key, value)
    return write_progress(root, progress)


def stage_completed(root: Path, stage: str, outs: dict[str, str]) -> None:
    progress = read_progress(root)
    if progress is not None:
        progress.completed[stage] = outs
        progress.stage = None
        write_progress(root, progress)
