"""Stage monitors: the versioned checks of closedloop/monitors over this batch and the previous
iterations' batches, read through DVC at the experiments ``monitors.versions`` names (the loop sets
it, oldest first, so `dvc repro` compares with the same ones).

Writes data/reports/monitors.json (every result, the failing monitors, and those of them named in
``monitors.block_promotion``, which hold the gate) and returns the numbers for metrics/monitors.json.
Nothing in the report depends on the clock: `dvc repro` writes the same bytes.
"""

from __future__ import annotations

import json
from typing import Any

from closedloop import workspace as paths
from closedloop.io import BatchFileError, json_objects, read_json, write_json
from closedloop.lineage.dvc import ITERATION_EXPERIMENT, DvcWorkspace
from closedloop.lineage.gitstate import DvcError
from closedloop.monitors import IterationData, numbers, report, run_monitors
from closedloop.stage_files import info_path, merge, metrics_path
from closedloop.stages.common import StageContext, StageError

# DVC-tracked batch files, read at each experiment by its record (DvcWorkspace.read_at), and the train
# stage's git-tracked figures (its numbers, and its info: the mode, why it did not train).
BATCH_FILES = {"samples": paths.SAMPLES, "rewards": paths.REWARDS, "rollouts": paths.ROLLOUTS,
               "canary": paths.CANARY_CHECK}
TRAIN_FILES = (metrics_path("train"), info_path("train"))


def run(ctx: StageContext) -> dict[str, Any]:
    settings = ctx.params.monitors
    iteration = ctx.params.loop.iteration
    current = _current(ctx)
    history = [_at_experiment(ctx, name) for name in settings.versions] if settings.enabled else []
    try:
        results = run_monitors(current, history, settings)
    except RuntimeError as error:  # run_monitors names the monitor and the batch
        raise StageError(str(error)) from None
    write_json(ctx.ws.monitors_report, {**report(iteration, results, list(settings.block_promotion)),
                                        "enabled": settings.enabled, "compared_with": list(settings.versions)})
    # Numbers only (metrics/monitors.json), flat keys "<monitor>.<figure>" nested one level by monitor
    # so `dvc metrics show` and MLflow group them per monitor.
    nested: dict[str, dict[str, float]] = {}
    for key, value in numbers(results).items():
        name, _, figure = key.partition(".")
        nested.setdefault(name, {})[figure] = value
    return nested


def _current(ctx: StageContext) -> IterationData:
    ws = ctx.ws
    train = merge(*(read_json(ws.path(p)) if ws.path(p).exists() else {} for p in TRAIN_FILES))
    return IterationData(
        iteration=ctx.params.loop.iteration, experiment=None,
        **{field: _jsonl(ws.path(relative).read_text(encoding="utf-8"), ws.path(relative))
           if ws.path(relative).exists() else [] for field, relative in BATCH_FILES.items()},
        train=train, evaluation=read_json(ws.evaluation) if ws.evaluation.exists() else {},
    )


def _at_experiment(ctx: StageContext, name: str) -> IterationData:
    """The batch experiment ``name`` saved; a file it lacks (saved before that file existed) is empty."""

    dvc = DvcWorkspace(ctx.ws.root)
    match = ITERATION_EXPERIMENT.fullmatch(name)
    if match is None:
        raise StageError(f"monitors.versions: {name!r} is not an iteration's experiment (iter-NNN-<fingerprint>)")

    def dvc_text(relative: str) -> str | None:
        try:
            return dvc.read_at(relative, name)
        except DvcError as error:
            if dvc.locate(relative, name) is None:  # it never recorded the file: nothing to compare
                return None
            raise StageError(f"monitors.versions: {error}") from None

    try:
        git_texts = [dvc.git_text_at(relative, name) for relative in TRAIN_FILES]
    except DvcError as error:  # no such experiment
        raise StageError(f"monitors.versions: {error}") from None
    source = lambda relative: f"experiment {name!r}, {relative}"  # noqa: E731
    batch = {}
    for field, relative in BATCH_FILES.items():
        text = dvc_text(relative)
        batch[field] = [] if text is None else _jsonl(text, source(relative))
    evaluation = dvc_text(paths.EVALUATION)
    return IterationData(
        iteration=int(match.group(1)), experiment=name, **batch,
        train=merge(*(_json(text, source(relative)) for text, relative in zip(git_texts, TRAIN_FILES))),
        evaluation=_json(evaluation, source(paths.EVALUATION)),
    )


def _jsonl(text: str, source: Any) -> list[dict]:
    try:
        return [row for _, row in json_objects(text.splitlines(), source)]
    except BatchFileError as error:
        raise StageError(str(error)) from None


def _json(text: str | None, source: str) -> dict:
    if text is None:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise StageError(f"{source}:{error.lineno}: not valid JSON ({error.msg})") from None
