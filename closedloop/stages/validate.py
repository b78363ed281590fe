"""Stage validate: the batch must pass its Great Expectations suite before anything trains on it.

The report and Data Docs are written whatever the outcome; a failing batch raises, which stops the
DVC pipeline and the Prefect flow before training.
"""

from __future__ import annotations

import shutil

from closedloop.io import read_jsonl, write_json
from closedloop.lineage.validation import validate_batch
from closedloop.stages.common import StageContext, StageError


class BatchValidationError(StageError):
    pass


def run(ctx: StageContext) -> dict:
    import pandas as pd

    graded = pd.DataFrame(read_jsonl(ctx.ws.graded))
    tasks = pd.DataFrame(read_jsonl(ctx.ws.tasks, required=("task_id", "env", "slice", "kind")))
    tasks = tasks[["task_id", "env", "slice", "kind"]]
    shutil.rmtree(ctx.ws.validation_dir, ignore_errors=True)  # a fresh report: no stale Data Docs pages
    fixes = pd.DataFrame(
        read_jsonl(ctx.ws.fixes),
        columns=["pair_id", "task_id", "failed_sample_id", "fixed_sample_id", "prompt", "completion"],
    )
    report = validate_batch(graded, tasks, fixes, k=ctx.params.sample.k, docs_dir=ctx.ws.validation_dir / "docs",
                            rounds=ctx.params.sample.rounds)
    write_json(ctx.ws.validation_report, report.to_dict())
    if not report.success:
        raise BatchValidationError(
            f"batch validation failed ({len(report.failures)} of {report.evaluated} expectations); "
            f"training will not start. Report: {ctx.ws.validation_report}\n{report.summary()}"
        )
    return {"expectations": report.evaluated, "success": True}
