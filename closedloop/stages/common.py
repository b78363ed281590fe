"""What every stage shares: the registry, the timer, and the metrics file each stage writes.

Everything imported here is code of every stage in dvc.yaml (pipeline.stage_code), so only what every
stage runs belongs here: the sandbox pools live in rewards/pools.py, the model's prompt settings in
stages/prompting.py, reading a tasks file in envs/base.py and recording a stage in DVC in
stages/recorded.py, each imported by the stages (or callers) that use it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from closedloop.faults import fault_point
from closedloop.io import write_json
from closedloop.pipeline import CONFIG_MODULE, PLOTS_MODULE, stage_spec
from closedloop.stage_files import StageClock, info_path, metrics_path, split_numbers, split_rates, timing_path
from closedloop.workspace import Workspace

if TYPE_CHECKING:  # the schema is loaded by name (pipeline.CONFIG_MODULE): see run_stage
    from closedloop.config import Params


@dataclass(frozen=True)
class StageContext:
    ws: Workspace
    params: Params | None  # None for a stage that reads no params (its StageSpec lists none)
    progress: bool = False

    def seed(self, stage: str) -> int:
        return self.params.stage_seed(stage)


class StageError(RuntimeError):
    """A stage refused its inputs; the message says which and why. The CLI exits non-zero on it."""


def stage_function(name: str) -> Callable[[StageContext], dict[str, Any]]:
    module = importlib.import_module(stage_spec(name).module)  # stage_spec: a clear error for an unknown name
    return module.run


def run_stage(name: str, workspace: Path | str = ".", params: Params | None = None,
              progress: bool = False) -> dict[str, Any]:
    """Run one stage in-process: read inputs → compute → write outputs, then the stage's small files
    (closedloop/stage_files.py): the numbers it returned in metrics/<name>.json, the rest in
    metrics/info/<name>.json, its timing (and throughput) in metrics/timing/<name>.json, its plot files.

    The DVC command (`closedloop stage NAME`) and the Prefect task both come through here. Returns
    what the stage returned, with ``seconds`` and the whole ``timing``.
    """

    ws = Workspace.at(workspace)
    spec = stage_spec(name)
    # A stage that reads no params gets none, not even the caller's: what it reads is what it states.
    if not spec.params:
        params = None
    elif params is None:
        params = importlib.import_module(CONFIG_MODULE).load_params(ws.root)  # by name: see CONFIG_MODULE
    context = StageContext(ws=ws, params=params, progress=progress)
    clock = StageClock()
    result = stage_function(name)(context)
    if spec.plots:
        plots = importlib.import_module(PLOTS_MODULE)  # by name: see PLOTS_MODULE
        for path in spec.plots:
            plots.write_plot(ws, path, params.loop.iteration)
    fault_point(f"stage:{name}")  # tests kill a run here: outputs written, not yet recorded
    numbers, rest = split_numbers(result)
    numbers, rates = split_rates(numbers)
    timing = {**clock.figures(), **rates}
    write_json(ws.path(metrics_path(name)), numbers)
    write_json(ws.path(info_path(name)), rest)
    write_json(ws.path(timing_path(name)), timing)
    return {**result, "seconds": timing["seconds"], "timing": timing}


def share_out(total: int, shares: dict[str, float]) -> dict[str, int]:
    """``total`` split by ``shares`` in whole numbers that add up to ``total`` (largest remainders,
    ties broken by name so the split is the same on every run)."""
    weight = sum(shares.values())
    exact = {name: total * share / weight for name, share in shares.items()}
    counts = {name: int(value) for name, value in exact.items()}
    left = total - sum(counts.values())
    for name in sorted(exact, key=lambda n: (counts[n] - exact[n], n))[:left]:
        counts[name] += 1
    return counts


def env_mix(params: Params, total: int, only: list[str] | None = None) -> dict[str, int]:
    """How many of ``total`` tasks (or references) each active environment gets, by its share; with
    ``only``, those environments alone share the total."""
    names = [name for name in params.envs.active() if not only or name in only]
    return share_out(total, {name: params.envs.section(name).share for name in names})
