"""What the train stage writes into a candidate's directory (``closedloop_training.json``): the mode, its
settings, the data mix and whether it trained at all. Read by the gate and lineage, which must not
import the train stage (and with it the sampling and reward code its on-policy rounds use)."""

from __future__ import annotations

import json

TRAINING_FILE = "closedloop_training.json"


def training_record(model_dir) -> dict:
    """What the train stage wrote into a candidate (``closedloop_training.json``); {} when absent."""
    path = model_dir / TRAINING_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def untrained_reason(record: dict) -> str | None:
    """Why a candidate is the champion unchanged (it trained 0 steps), or None when it trained; from
    any record holding the train stage's ``trained`` and ``untrained_reason`` (its training record, its
    metrics, the gate's record). The one place the rule is written."""
    if record.get("trained", True):
        return None
    return record.get("untrained_reason") or "it trained 0 steps"
