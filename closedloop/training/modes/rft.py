"""Mode rft: rejection-sampling fine-tuning on the batch's positives and failure→fix pairs (the grade
stage's training set), the references (``train.include_references``), and the positives of earlier
batches replayed through DVC (``train.replay``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from closedloop.io import read_jsonl
from closedloop.models.prompts import prompt_key
from closedloop.training.modes.base import TrainingError, TrainingRun
from closedloop.training.modes.supervised import SupervisedMode
from closedloop.workspace import TRAIN_SET, Workspace

if TYPE_CHECKING:
    from closedloop.config import TrainParams


class RftMode(SupervisedMode):
    name = "rft"
    empty_reason = "the batch has no new examples (positives, fixes or unsolved references)"

    def inputs(self, ws: Workspace, params: TrainParams) -> tuple[Path, ...]:
        return (ws.train_set, ws.references) if params.include_references else (ws.train_set,)

    def uses_references(self, params: TrainParams) -> bool:
        return params.include_references

    def new_records(self, run: TrainingRun) -> tuple[list[dict], dict[str, int]]:
        records = read_jsonl(run.ws.train_set, required=("source", "prompt", "completion"))
        replayed, replay = replay_positives(run, records)
        return records + replayed, replay


def replay_positives(run: TrainingRun, current: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """Positives of the batches saved as the experiments in ``train.replay.versions``, read through
    DVC (the run's ``read_saved``); see :func:`select_replay` for which are kept."""

    replay = run.params.train.replay
    if not replay.versions or replay.max_fraction == 0:
        return [], {}
    batches = {}
    for version in replay.versions:
        try:
            text = run.read_saved(TRAIN_SET, version)
        except TrainingError as error:
            raise TrainingError(f"train.replay.versions: {error}") from None
        batches[version] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                batches[version].append(json.loads(line))
            except ValueError as error:
                raise TrainingError(f"train.replay.versions: experiment {version!r}, {TRAIN_SET}:{number}: not "
                                    f"valid JSON ({error})") from None
    return select_replay(current, batches, replay.max_fraction)


def select_replay(current: list[dict], batches: dict[str, list[dict]],
                  max_fraction: float) -> tuple[list[dict], dict[str, int]]:
    """The earlier batches' positives not already in ``current``, the most recent version first,
    capped so that replayed / (current + replayed) <= ``max_fraction``.

    ``batches`` maps each version, oldest first, to its training-set records. Returns the records
    (source "replay", origin "<version>:<sample>") and how many came from each version.
    """
    seen = {(prompt_key(r["prompt"]), r["completion"]) for r in current}
    cap = int(len(current) * max_fraction / (1 - max_fraction))
    kept: list[dict] = []
    mix = {version: 0 for version in batches}
    for version in reversed(list(batches)):
        for row in batches[version]:
            key = (prompt_key(row["prompt"]), row["completion"])
            if len(kept) >= cap:
                break
            if row.get("source") == "positive" and key not in seen:
                seen.add(key)
                kept.append({**row, "source": "replay", "origin": f"{version}:{row.get('origin', '')}"})
                mix[version] += 1
    return kept, mix
