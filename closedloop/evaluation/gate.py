"""The promotion gate: promote only if the overall score improves and no slice regresses."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence


@dataclass
class GateDecision:
    promote: bool
    reasons: list[str]
    overall_delta: float
    slice_deltas: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(champion: dict[str, Any], candidate: dict[str, Any], *, min_improvement: float,
           slice_tolerance: float, noise_z: float = 0.0, untrained: str | None = None,
           known_hacks: Sequence[Mapping[str, Any]] = (),
           review: Mapping[str, Any] | None = None,
           monitors_holding: Sequence[Mapping[str, Any]] = (),
           monitors_failing: Sequence[Mapping[str, Any]] = ()) -> GateDecision:
    """Compare two benchmark summaries (see stats.summarize); every reason names the figures.

    Every environment and every env/slice is checked. A drop is a regression when it exceeds both
    ``slice_tolerance`` and ``noise_z`` standard errors of the difference: small slices measured with
    a few samples move by more than a fixed tolerance from sampling noise alone.

    ``untrained`` (why the candidate trained 0 steps) holds it whatever the figures say: it is the
    champion unchanged, and any difference measured is noise.

    ``known_hacks`` (rows of the reward stage's known-hacks check, rewards/hacks.py) hold it too when
    any of them ``holds``: a completion a person labelled reward hacking that today's verifier passes
    (or could not judge) would be learnt from again, whatever the benchmark says.

    ``review`` is what people said about this batch before the gate (review.mode before_promotion,
    data/reports/review.json): a sample they marked as reward hacking holds the candidate trained on
    that batch; a review that timed out is said, and decides nothing.

    ``monitors_holding`` (results of data/reports/monitors.json, MonitorResult.to_dict) are the failing
    monitors named in ``monitors.block_promotion``: each holds the candidate, whatever its figures.
    ``monitors_failing`` are the other failing monitors: said, deciding nothing.
    """
    champ_overall = champion["overall"]["pass@1"]
    cand_overall = candidate["overall"]["pass@1"]
    delta = cand_overall - champ_overall
    reasons: list[str] = []
    promote = True
    if untrained:
        promote = False
        reasons.append(f"candidate not trained: 0 steps ({untrained}); it is the champion unchanged")
    held = [hack for hack in known_hacks if hack["holds"]]
    for hack in held:
        promote = False
        said = f"labelled by {hack['reviewer']}" if hack.get("reviewer") else "labelled"
        if hack.get("iteration") is not None:
            said += f" in iteration {hack['iteration']}"
        judged = (f"passes (reward {hack['reward']:.3f})" if hack["status"] != "infra_error"
                  else "could not be judged (sandbox infrastructure error)")
        reasons.append(f"known reward hack {hack['sample_id']} ({said}) {judged} under {hack['verifier']} "
                       f"{hack['verifier_version']}; every verifier must fail known hacks")
    if known_hacks and not held:
        reasons.append(f"known reward hacks: all {len(known_hacks)} fail under today's verifiers")
    if review and review.get("mode") == "before_promotion":
        flagged = [a for a in review.get("answers", ()) if a.get("label") == "reward_hacking"]
        for answer in flagged:
            promote = False
            reasons.append(f"human review: {answer['reviewer']} marked sample {answer['sample_id']} of this batch "
                           "as reward hacking; the candidate learnt from that batch")
        if review.get("state") == "answered" and not flagged:
            reasons.append(f"human review: {len(review.get('answers', ()))} answer(s) from "
                           f"{', '.join(review.get('reviewers', ()))}, none marking reward hacking")
        elif review.get("state") != "answered":
            reasons.append(f"human review: no human scores came ({review.get('state')}); decided without them")
    for monitor in monitors_holding:
        promote = False
        reasons.append(f"{monitor_reason(monitor)}; monitors.block_promotion holds the candidate")
    for monitor in monitors_failing:
        reasons.append(f"{monitor_reason(monitor)}; not in monitors.block_promotion, so it holds nothing")
    if delta > min_improvement:
        reasons.append(f"overall pass@1 {cand_overall:.3f} vs champion {champ_overall:.3f} "
                       f"(+{delta:.3f} > min_improvement {min_improvement})")
    else:
        promote = False
        reasons.append(f"overall pass@1 {cand_overall:.3f} vs champion {champ_overall:.3f} "
                       f"({delta:+.3f} does not exceed min_improvement {min_improvement})")
    slice_deltas = {}
    groups = [(f"env {name}", figures) for name, figures in sorted(champion.get("envs", {}).items())]
    groups += [(f"slice {name}", figures) for name, figures in sorted(champion["slices"].items())]
    candidate_groups = {**{f"env {name}": figures for name, figures in candidate.get("envs", {}).items()},
                        **{f"slice {name}": figures for name, figures in candidate["slices"].items()}}
    for name, champ_slice in groups:
        cand_slice = candidate_groups.get(name)
        if cand_slice is None:
            promote = False
            reasons.append(f"{name}: missing from the candidate's evaluation")
            continue
        slice_delta = cand_slice["pass@1"] - champ_slice["pass@1"]
        slice_deltas[name.split(" ", 1)[1]] = slice_delta
        noise = noise_z * math.hypot(champ_slice.get("se", 0.0), cand_slice.get("se", 0.0))
        allowed = max(slice_tolerance, noise)
        why = f"slice_tolerance {slice_tolerance}" if allowed == slice_tolerance else f"{noise_z} standard errors ({noise:.3f})"
        if slice_delta < -allowed:
            promote = False
            reasons.append(f"{name} regressed {slice_delta:+.3f} "
                           f"({cand_slice['pass@1']:.3f} vs {champ_slice['pass@1']:.3f}), beyond {why}")
        else:
            reasons.append(f"{name}: {slice_delta:+.3f} within {why}")
    return GateDecision(promote=promote, reasons=reasons, overall_delta=delta, slice_deltas=slice_deltas)


def monitor_reason(monitor: Mapping[str, Any]) -> str:
    """The gate's words for one failing monitor, e.g. "monitor anomaly_rates (version 1) failed: <its
    message> (value 0.400 > fail 0.150)"."""
    value, fail = monitor.get("value"), monitor.get("fail")
    figures = f" (value {value:.3f} > fail {fail:g})" if value is not None and fail is not None else ""
    return f"monitor {monitor['name']} (version {monitor['version']}) failed: {monitor['message'].rstrip('.')}{figures}"
