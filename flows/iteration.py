"""One closed-loop iteration: the DAG of ARCHITECTURE.md as Prefect tasks, one per stage."""

from __future__ import annotations

import time
from typing import Optional

from prefect import flow
from prefect.artifacts import create_table_artifact

from closedloop.config import Params, load_params
from closedloop.lineage.record import benchmark_rows
from closedloop.workspace import Workspace
from tasks import lineage, stages


@flow(name="closedloop-iteration", log_prints=True)
def iteration_flow(params: Optional[Params] = None, workspace: str = ".", progress: bool = False) -> dict:
    """Sample the champion on fresh tasks, score, grade, validate, train a candidate, gate, promote."""
    started = time.perf_counter()
    previous = load_params(workspace)
    params = lineage.begin_iteration(workspace, params or previous, previous)
    lineage.close_loop(workspace)
    timing = {"task": {}, "work": {}, "recorded": {}}
    current = "generate"
    try:
        for current, step in (
            ("generate", stages.generate),
            ("sample", stages.sample),
            ("reward", stages.reward),
            ("grade", stages.grade),
            ("validate", stages.validate),  # a failing batch stops here, before training
            ("train", stages.train),
            ("evaluate", stages.evaluate),
            ("gate", stages.gate),
            ("promote", stages.promote),
        ):
            step_started = time.perf_counter()
            metrics = step(workspace, params, progress)
            timing["task"][current] = time.perf_counter() - step_started
            timing["work"][current] = metrics["seconds"]
            timing["recorded"][current] = metrics["recorded_seconds"]
    except Exception as error:
        lineage.record_failure(workspace, params, current, str(error))
        raise
    version_started = time.perf_counter()
    lineage.push(workspace, params)
    summary = lineage.version(workspace, params, timing["task"])
    timing["version_seconds"] = time.perf_counter() - version_started
    create_table_artifact(
        key=f"benchmark-iteration-{params.loop.iteration}",
        table=benchmark_rows(Workspace.at(workspace)),
        description=f"Benchmark pass@1, champion vs candidate, iteration {params.loop.iteration}: "
        + ("promoted" if summary["promoted"] else "held")
        + (f" (not trained: {summary['not_trained']})" if summary.get("not_trained") else ""),
    )
    timing["total_seconds"] = time.perf_counter() - started
    return {**summary, "timing": timing}
