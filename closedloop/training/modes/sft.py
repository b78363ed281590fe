"""Mode sft: the warm-start references only (a control: what training without the loop's data gives)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from closedloop.training.modes.supervised import SupervisedMode
from closedloop.workspace import Workspace

if TYPE_CHECKING:
    from closedloop.config import TrainParams


class SftMode(SupervisedMode):
    name = "sft"

    def inputs(self, ws: Workspace, params: TrainParams) -> tuple[Path, ...]:
        return (ws.references,)
