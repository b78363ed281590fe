"""The promotion gate: promote only if the overall score improves and no slice regresses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GateDecision:
    promote: bool
    reasons: list[str]
    overall_delta: float
    slice_deltas: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(champion: dict[str, Any], candidate: dict[str, Any], *, min_improvement: float,
           slice_tolerance: float) -> GateDecision:
    """Compare two benchmark summaries (see stats.summarize); every reason names the figures."""
    champ_overall = champion["overall"]["pass@1"]
    cand_overall = candidate["overall"]["pass@1"]
    delta = cand_overall - champ_overall
    reasons: list[str] = []
    promote = True
    if delta > min_improvement:
        reasons.append(f"overall pass@1 {cand_overall:.3f} vs champion {champ_overall:.3f} "
                       f"(+{delta:.3f} > min_improvement {min_improvement})")
    else:
        promote = False
        reasons.append(f"overall pass@1 {cand_overall:.3f} vs champion {champ_overall:.3f} "
                       f"({delta:+.3f} does not exceed min_improvement {min_improvement})")
    slice_deltas = {}
    for name, champ_slice in sorted(champion["slices"].items()):
        cand_slice = candidate["slices"].get(name)
        if cand_slice is None:
            promote = False
            reasons.append(f"slice {name}: missing from the candidate's evaluation")
            continue
        slice_delta = cand_slice["pass@1"] - champ_slice["pass@1"]
        slice_deltas[name] = slice_delta
        if slice_delta < -slice_tolerance:
            promote = False
            reasons.append(f"slice {name} regressed {slice_delta:+.3f} "
                           f"({cand_slice['pass@1']:.3f} vs {champ_slice['pass@1']:.3f}), "
                           f"beyond slice_tolerance {slice_tolerance}")
        else:
            reasons.append(f"slice {name}: {slice_delta:+.3f} within slice_tolerance {slice_tolerance}")
    return GateDecision(promote=promote, reasons=reasons, overall_delta=delta, slice_deltas=slice_deltas)
