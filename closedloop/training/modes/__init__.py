"""Training modes, found by name: ``train.mode`` → a TrainingMode (modes/base.py).

Entries are "module:Class" strings, as for environments, so looking one up imports only that mode's
module. A new mode is a new module here, one line in MODES, and its name among the values
``train.mode`` accepts (config/training.py); tests/unit/test_training_modes.py checks the two agree.
"""

from __future__ import annotations

from closedloop.entries import load_entry
from closedloop.training.modes.base import TrainingMode

MODES: dict[str, str] = {
    "sft": "closedloop.training.modes.sft:SftMode",
    "rft": "closedloop.training.modes.rft:RftMode",
    "grpo": "closedloop.training.modes.grpo:GrpoMode",
}
ENTRY_POINT_GROUP = "closedloop.training_modes"  # load_entry's second form; the built-ins are "module:Class"


class TrainingModeError(ValueError):
    """No training mode has that name, or its entry does not load; the message says which."""


def training_mode(name: str) -> TrainingMode:
    """The mode ``train.mode`` names, constructed."""
    if name not in MODES:
        raise TrainingModeError(f"train.mode: unknown training mode {name!r}; known: {sorted(MODES)}")
    return load_entry(MODES[name], f"built-in training mode {name!r}", ENTRY_POINT_GROUP, TrainingModeError)()
