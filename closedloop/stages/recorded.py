"""A stage run in-process and then recorded in dvc.lock, as `dvc repro` would have recorded it.

Not in stages/common.py: no stage imports this module, so the DVC adapter is not code of every stage
(an edit to lineage/dvc/ must not make `dvc repro` rerun the pipeline).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from closedloop.config import Params
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.stages.common import run_stage


def run_recorded(name: str, workspace: Path | str, params: Params, progress: bool = False) -> dict[str, Any]:
    """Run a stage in-process, then record it in dvc.lock exactly as `dvc repro` would have.

    This is what the Prefect tasks call: the stage function is the one `closedloop stage NAME` runs,
    so an iteration from the Prefect UI leaves `dvc status` clean and `dvc repro` with nothing to do.
    """
    started = time.perf_counter()
    metrics = run_stage(name, workspace, params, progress)
    DvcWorkspace(Path(workspace)).commit(name)
    return {**metrics, "recorded_seconds": round(time.perf_counter() - started, 3)}
