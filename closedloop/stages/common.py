"""What every stage shares: the registry, the timer, and the metrics file each stage writes."""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from closedloop.config import Params, load_params
from closedloop.io import write_json
from closedloop.workspace import Workspace


@dataclass(frozen=True)
class StageContext:
    ws: Workspace
    params: Params
    progress: bool = False

    def seed(self, stage: str) -> int:
        return self.params.stage_seed(stage)


class StageError(RuntimeError):
    """A stage refused its inputs; the message says which and why. The CLI exits non-zero on it."""


def stage_function(name: str) -> Callable[[StageContext], dict[str, Any]]:
    from closedloop.pipeline import stage_spec

    stage_spec(name)  # a clear error for an unknown name
    module = importlib.import_module(f"closedloop.stages.{name}")
    return module.run


def run_stage(name: str, workspace: Path | str = ".", params: Params | None = None,
              progress: bool = False) -> dict[str, Any]:
    """Run one stage in-process: read inputs → compute → write outputs and metrics/<name>.json.

    The DVC command (`closedloop stage NAME`) and the Prefect task both come through here.
    """
    ws = Workspace.at(workspace)
    params = params or load_params(ws.root)
    context = StageContext(ws=ws, params=params, progress=progress)
    started = time.perf_counter()
    metrics = stage_function(name)(context)
    metrics = {**metrics, "seconds": round(time.perf_counter() - started, 3)}
    write_json(ws.metrics(name), metrics)
    return metrics


def sandbox_pool(params: Params, env: str = "code"):
    """A sandbox pool with environment ``env``'s limits and isolation (params.envs.<env>.sandbox)."""
    from closedloop.sandbox import SandboxPool

    settings = getattr(params.envs, env).sandbox
    return SandboxPool(workers=params.reward.workers, limits=settings.limits(), isolation=settings.isolation)


def check_sampling_settings(model_dir: Path, params: Params) -> list[str]:
    """The requested sampling settings against those the model's rollouts used (see models/settings.py)."""
    from closedloop.models.settings import SettingsMismatch, check_settings

    try:
        found = check_settings(model_dir, params.sample, params.sample.settings_mismatch)
    except SettingsMismatch as error:
        raise StageError(str(error)) from None
    for line in found:
        print(f"closedloop: warning: {model_dir}: {line}", file=sys.stderr)
    return found


def load_tasks(path: Path):
    from closedloop.envs.base import Task
    from closedloop.io import read_jsonl

    fields = list(Task.__dataclass_fields__)
    return [Task.from_record({k: r[k] for k in fields}) for r in read_jsonl(path, required=fields)]


def run_recorded(name: str, workspace: Path | str, params: Params, progress: bool = False) -> dict[str, Any]:
    """Run a stage in-process, then record it in dvc.lock exactly as `dvc repro` would have.

    This is what the Prefect tasks call: the stage function is the one `closedloop stage NAME` runs,
    so an iteration from the Prefect UI leaves `dvc status` clean and `dvc repro` with nothing to do.
    """
    from closedloop.lineage.dvc import DvcWorkspace

    started = time.perf_counter()
    metrics = run_stage(name, workspace, params, progress)
    DvcWorkspace(Path(workspace)).commit(name)
    return {**metrics, "recorded_seconds": round(time.perf_counter() - started, 3)}
