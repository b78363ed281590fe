"""Closing the loop: the model the last iteration promoted (or the warm start) becomes this iteration's
champion input, recorded with `dvc add` beside the human labels, known hacks and review outcome it reads."""

from __future__ import annotations

from closedloop import workspace as paths
from closedloop.io import replace_dir, write_json
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.models.loading import model_fingerprint
from closedloop.workspace import Workspace


def has_champion(ws: Workspace) -> bool:
    return (ws.root / (paths.CHAMPION + ".dvc")).exists() and ws.champion.exists()


def close_loop(ws: Workspace, closed: str | None = None) -> str:
    """Make the model the last iteration promoted (or the warm start) this iteration's champion input;
    return its fingerprint.

    ``closed`` is the champion an unfinished iteration already closed its loop on (its progress
    record): resumed after its own promote stage wrote data/models/next_champion, the iteration must
    keep the champion it started from, not take its own candidate. Otherwise the champion is always
    recorded again with `dvc add` (cheap when unchanged): a kill between copying it and recording it
    must not leave a data/champion.dvc that names the previous champion."""

    if closed is not None and has_champion(ws) and model_fingerprint(ws.champion) == closed:
        record_labels(ws)
        return closed
    source = ws.next_champion if ws.next_champion.exists() else ws.warmstart_model
    wanted = model_fingerprint(source)
    if not ws.champion.exists() or model_fingerprint(ws.champion) != wanted:
        replace_dir(source, ws.champion)
    DvcWorkspace(ws.root).add(paths.CHAMPION, *ensure_labels(ws))
    return wanted


def ensure_labels(ws: Workspace) -> tuple[str, ...]:
    """The human labels and known hacks files, and the review outcome the gate reads (dvc.yaml deps):
    created empty when missing, so they exist from the first iteration on, answered or not.

    A file DVC recorded (its .dvc pointer is there) that is missing now is not made anew: recording an
    empty file would erase every label and known hack from the next version."""
    for relative in (paths.HUMAN_LABELS, paths.KNOWN_HACKS):
        path = ws.root / relative
        if not path.exists():
            if (ws.root / f"{relative}.dvc").exists():
                raise FileNotFoundError(f"{relative} is missing, but {relative}.dvc records it: restore it with "
                                        f"`dvc checkout {relative}` (or `dvc pull {relative}`) before the next run")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    if not ws.review_outcome.exists():
        write_json(ws.review_outcome, {"iteration": None, "mode": "off", "state": "not_requested",
                                       "reviewers": [], "answers": []})
    return paths.HUMAN_LABELS, paths.KNOWN_HACKS, paths.REVIEW_OUTCOME


def record_labels(ws: Workspace) -> None:
    """`dvc add` the labels as they are now: the answers a review appended since the last iteration
    become this iteration's input, a version of their own."""
    DvcWorkspace(ws.root).add(*ensure_labels(ws))
