"""Stage gate: decide promote or hold from the evaluation; the decision and its reasons are the report.

A candidate that trained 0 steps (its closedloop_training.json says why) is held whatever it scored,
and so is every candidate while a known reward hack scores above 0 under today's verifier (the reward
stage's known-hacks check), and when people reviewing this batch before promotion marked a sample
as reward hacking (data/reports/review.json, written by the iteration flow), and while a monitor named
in ``monitors.block_promotion`` failed (data/reports/monitors.json, the monitors stage's report).
"""

from __future__ import annotations

from closedloop.evaluation.gate import decide
from closedloop.io import read_json, read_jsonl, write_json
from closedloop.rewards.hacks import KNOWN_HACKS_CHECK
from closedloop.stages.common import StageContext, StageError
from closedloop.training.candidate_record import training_record, untrained_reason

MONITOR_KEYS = ("name", "version", "verdict", "value", "warn", "fail", "message")  # the report's table


def run(ctx: StageContext) -> dict:
    evaluation = read_json(ctx.ws.evaluation)
    # The candidate directory is the evaluation's input, and its fingerprint (which covers this file)
    # is in the evaluation: a change here reruns the evaluation and so the gate.
    untrained = untrained_reason(training_record(ctx.ws.candidate))
    hacks = read_jsonl(ctx.ws.path(KNOWN_HACKS_CHECK),
                       required=("sample_id", "reward", "status", "holds", "verifier", "verifier_version"))
    monitors = _monitors(ctx)
    blocking = ctx.params.monitors.block_promotion
    failing = [monitor for monitor in monitors if monitor["verdict"] == "fail"]
    holding = [monitor for monitor in failing if monitor["name"] in blocking]
    decision = decide(
        evaluation["champion"]["summary"], evaluation["candidate"]["summary"],
        min_improvement=ctx.params.gate.min_improvement, slice_tolerance=ctx.params.gate.slice_tolerance,
        noise_z=ctx.params.gate.noise_z, untrained=untrained, known_hacks=hacks,
        review=read_json(ctx.ws.review_outcome) if ctx.ws.review_outcome.exists() else None,
        monitors_holding=holding, monitors_failing=[m for m in failing if m["name"] not in blocking],
        confirmation=evaluation.get("confirmation"),
    )
    report = {
        **decision.to_dict(),
        "trained": untrained is None, "untrained_reason": untrained,
        "champion": {"model_version": evaluation["champion"]["model_version"],
                     **evaluation["champion"]["summary"]},
        "candidate": {"model_version": evaluation["candidate"]["model_version"],
                      **evaluation["candidate"]["summary"]},
        "settings": {"min_improvement": ctx.params.gate.min_improvement,
                     "slice_tolerance": ctx.params.gate.slice_tolerance, "noise_z": ctx.params.gate.noise_z,
                     "confirm_samples": ctx.params.gate.confirm_samples,
                     "block_promotion": list(blocking)},
        # What the gate report's monitors table shows (reports/gate_report.py).
        "monitors": [{key: monitor.get(key) for key in MONITOR_KEYS} for monitor in monitors],
        "monitors_holding": [monitor["name"] for monitor in holding],
        # The groups measured again (the evaluate stage's second look) and their figures there.
        "confirmation": evaluation.get("confirmation"),
        # Episodes (sample.rounds > 1): the gate decided on the last round; each round's figure beside it.
        **({"rounds": rounds} if (rounds := _rounds(evaluation)) else {}),
    }
    write_json(ctx.ws.gate, report)
    return {"promote": decision.promote, "overall_delta": decision.overall_delta, "trained": untrained is None,
            "known_hacks_holding": sum(1 for hack in hacks if hack["holds"]), "monitors_holding": len(holding)}


def _rounds(evaluation: dict) -> dict | None:
    """Per role: overall pass@1 after each round, and the correction rate; None without episodes."""
    if "rounds" not in evaluation["candidate"]:
        return None
    return {role: {"pass@1": [s["overall"]["pass@1"] for s in evaluation[role]["rounds"]["by_round"]],
                   "correction_rate": evaluation[role]["rounds"]["correction_rate"]["rate"]}
            for role in ("champion", "candidate")}


def _monitors(ctx: StageContext) -> list[dict]:
    """The monitors stage's results (data/reports/monitors.json). A gate run on its own, without the
    report, holds on no monitor: an error when monitors.block_promotion asks it to."""
    if ctx.ws.monitors_report.exists():
        return read_json(ctx.ws.monitors_report)["monitors"]
    if ctx.params.monitors.block_promotion:
        raise StageError(f"{ctx.ws.monitors_report} not found, but monitors.block_promotion names "
                         f"{', '.join(ctx.params.monitors.block_promotion)}: run the monitors stage before the gate")
    return []
