"""Stage gate: decide promote or hold from the evaluation; the decision and its reasons are the report."""

from __future__ import annotations

from closedloop.evaluation.gate import decide
from closedloop.io import read_json, write_json
from closedloop.stages.common import StageContext


def run(ctx: StageContext) -> dict:
    evaluation = read_json(ctx.ws.evaluation)
    decision = decide(
        evaluation["champion"]["summary"], evaluation["candidate"]["summary"],
        min_improvement=ctx.params.gate.min_improvement, slice_tolerance=ctx.params.gate.slice_tolerance,
        noise_z=ctx.params.gate.noise_z,
    )
    report = {
        **decision.to_dict(),
        "champion": {"model_version": evaluation["champion"]["model_version"],
                     **evaluation["champion"]["summary"]},
        "candidate": {"model_version": evaluation["candidate"]["model_version"],
                      **evaluation["candidate"]["summary"]},
        "settings": {"min_improvement": ctx.params.gate.min_improvement,
                     "slice_tolerance": ctx.params.gate.slice_tolerance, "noise_z": ctx.params.gate.noise_z},
    }
    write_json(ctx.ws.gate, report)
    return {"promote": decision.promote, "overall_delta": decision.overall_delta}
