"""One module per DVC stage: read inputs → call the core → write outputs and metrics."""

from closedloop.stages.common import StageContext, StageError, run_stage

__all__ = ["StageContext", "StageError", "run_stage"]
