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


def groups(summary: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A summary's groups the gate checks, by the names its reasons use: "env code", then "slice
    code/core", each sorted."""
    named = {f"env {name}": figures for name, figures in sorted(summary.get("envs", {}).items())}
    named.update((f"slice {name}", figures) for name, figures in sorted(summary["slices"].items()))
    return named


def allowed_drop(champion: Mapping[str, Any], candidate: Mapping[str, Any], *, slice_tolerance: float,
                 noise_z: float) -> tuple[float, str]:
    """How far one group's pass@1 may fall, and why that far: the larger of ``slice_tolerance`` and
    ``noise_z`` standard errors of the difference."""
    noise = noise_z * math.hypot(champion.get("se", 0.0), candidate.get("se", 0.0))
    allowed = max(slice_tolerance, noise)
    why = f"slice_tolerance {slice_tolerance}" if allowed == slice_tolerance else f"{noise_z} standard errors ({noise:.3f})"
    return allowed, why


def regressed_groups(champion: Mapping[str, Any], candidate: Mapping[str, Any], *, slice_tolerance: float,
                     noise_z: float) -> list[str]:
    """The groups (names as :func:`groups` gives them) whose drop is beyond what :func:`decide` allows:
    the ones the evaluate stage measures again when ``gate.confirm_samples`` asks it to."""
    candidate_groups = groups(candidate)
    return [name for name, champ in groups(champion).items() if name in candidate_groups
            and candidate_groups[name]["pass@1"] - champ["pass@1"]
            < -allowed_drop(champ, candidate_groups[name], slice_tolerance=slice_tolerance, noise_z=noise_z)[0]]


def decide(champion: dict[str, Any], candidate: dict[str, Any], *, min_improvement: float,
           slice_tolerance: float, noise_z: float = 0.0, untrained: str | None = None,
           known_hacks: Sequence[Mapping[str, Any]] = (),
           review: Mapping[str, Any] | None = None,
           monitors_holding: Sequence[Mapping[str, Any]] = (),
           monitors_failing: Sequence[Mapping[str, Any]] = (),
           confirmation: Mapping[str, Any] | None = None) -> GateDecision:
    """Compare two benchmark summaries (see stats.summarize); every reason names the figures.

    Every environment and every env/slice is checked. A drop is a regression when it exceeds both
    ``slice_tolerance`` and ``noise_z`` standard errors of the difference: small slices measured with
    a few samples move by more than a fixed tolerance from sampling noise alone.

    ``confirmation`` (evaluation.json's, written by the evaluate stage under ``gate.confirm_samples``)
    holds the groups that regressed in the first evaluation, measured again for both models with more
    samples per task and a new seed: {"samples_per_task", "groups": {name: {"champion", "candidate"}}}.
    Such a group is decided by the same rule on those figures alone. With some 25 groups checked at 2
    standard errors each, one of them falls beyond its band by chance in a good share of evaluations;
    a regression must now show twice, and the second, larger measurement is not selected for being low.

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
    delta = candidate["overall"]["pass@1"] - champion["overall"]["pass@1"]
    checks = [
        _untrained_reasons(untrained),
        _known_hack_reasons(known_hacks),
        _review_reasons(review),
        _monitor_reasons(monitors_holding, monitors_failing),
        _overall_reasons(champion, candidate, min_improvement=min_improvement),
    ]
    group_holds, group_reasons, slice_deltas = _group_reasons(
        champion, candidate, slice_tolerance=slice_tolerance, noise_z=noise_z, confirmation=confirmation)
    checks.append((group_holds, group_reasons))
    return GateDecision(promote=not any(holds for holds, _ in checks),
                        reasons=[reason for _, reasons in checks for reason in reasons],
                        overall_delta=delta, slice_deltas=slice_deltas)


# Each check below says whether it holds the candidate, and its reasons in the order decide gives them.

def _untrained_reasons(untrained: str | None) -> tuple[bool, list[str]]:
    if not untrained:
        return False, []
    return True, [f"candidate not trained: 0 steps ({untrained}); it is the champion unchanged"]


def _known_hack_reasons(known_hacks: Sequence[Mapping[str, Any]]) -> tuple[bool, list[str]]:
    reasons = []
    held = [hack for hack in known_hacks if hack["holds"]]
    for hack in held:
        said = f"labelled by {hack['reviewer']}" if hack.get("reviewer") else "labelled"
        if hack.get("iteration") is not None:
            said += f" in iteration {hack['iteration']}"
        judged = (f"passes (reward {hack['reward']:.3f})" if hack["status"] != "infra_error"
                  else "could not be judged (sandbox infrastructure error)")
        reasons.append(f"known reward hack {hack['sample_id']} ({said}) {judged} under {hack['verifier']} "
                       f"{hack['verifier_version']}; every verifier must fail known hacks")
    if known_hacks and not held:
        reasons.append(f"known reward hacks: all {len(known_hacks)} fail under today's verifiers")
    return bool(held), reasons


def _review_reasons(review: Mapping[str, Any] | None) -> tuple[bool, list[str]]:
    if not (review and review.get("mode") == "before_promotion"):
        return False, []
    reasons = []
    flagged = [a for a in review.get("answers", ()) if a.get("label") == "reward_hacking"]
    for answer in flagged:
        reasons.append(f"human review: {answer['reviewer']} marked sample {answer['sample_id']} of this batch "
                       "as reward hacking; the candidate learnt from that batch")
    if review.get("state") == "answered" and not flagged:
        reasons.append(f"human review: {len(review.get('answers', ()))} answer(s) from "
                       f"{', '.join(review.get('reviewers', ()))}, none marking reward hacking")
    elif review.get("state") != "answered":
        reasons.append(f"human review: no human scores came ({review.get('state')}); decided without them")
    return bool(flagged), reasons


def _monitor_reasons(monitors_holding: Sequence[Mapping[str, Any]],
                     monitors_failing: Sequence[Mapping[str, Any]]) -> tuple[bool, list[str]]:
    reasons = [f"{monitor_reason(monitor)}; monitors.block_promotion holds the candidate" for monitor in monitors_holding]
    reasons += [f"{monitor_reason(monitor)}; not in monitors.block_promotion, so it holds nothing"
                for monitor in monitors_failing]
    return bool(monitors_holding), reasons


def _overall_reasons(champion: Mapping[str, Any], candidate: Mapping[str, Any], *,
                     min_improvement: float) -> tuple[bool, list[str]]:
    champ_overall = champion["overall"]["pass@1"]
    cand_overall = candidate["overall"]["pass@1"]
    delta = cand_overall - champ_overall
    if delta > min_improvement:
        return False, [f"overall pass@1 {cand_overall:.3f} vs champion {champ_overall:.3f} "
                       f"(+{delta:.3f} > min_improvement {min_improvement})"]
    return True, [f"overall pass@1 {cand_overall:.3f} vs champion {champ_overall:.3f} "
                  f"({delta:+.3f} does not exceed min_improvement {min_improvement})"]


def _group_reasons(champion: Mapping[str, Any], candidate: Mapping[str, Any], *, slice_tolerance: float,
                   noise_z: float, confirmation: Mapping[str, Any] | None) -> tuple[bool, list[str], dict[str, float]]:
    """Every group of the champion checked against the candidate's (or the confirmation's figures):
    (whether any holds the candidate, the reasons, each group's pass@1 delta by its bare name)."""
    holds = False
    reasons: list[str] = []
    slice_deltas = {}
    candidate_groups = groups(candidate)
    confirmed = (confirmation or {}).get("groups", {})
    for name, champ_slice in groups(champion).items():
        cand_slice = candidate_groups.get(name)
        if cand_slice is None:
            holds = True
            reasons.append(f"{name}: missing from the candidate's evaluation")
            continue
        slice_delta = cand_slice["pass@1"] - champ_slice["pass@1"]
        first = ""
        if name in confirmed:  # decided on the second measurement; the first is said
            _, why = allowed_drop(champ_slice, cand_slice, slice_tolerance=slice_tolerance, noise_z=noise_z)
            first = (f", measured again at {confirmation['samples_per_task']} samples per task after the first "
                     f"evaluation's {slice_delta:+.3f} ({cand_slice['pass@1']:.3f} vs {champ_slice['pass@1']:.3f}) "
                     f"fell beyond {why}")
            champ_slice, cand_slice = confirmed[name]["champion"], confirmed[name]["candidate"]
            slice_delta = cand_slice["pass@1"] - champ_slice["pass@1"]
        slice_deltas[name.split(" ", 1)[1]] = slice_delta
        allowed, why = allowed_drop(champ_slice, cand_slice, slice_tolerance=slice_tolerance, noise_z=noise_z)
        if slice_delta < -allowed:
            holds = True
            reasons.append(f"{name} regressed {slice_delta:+.3f} "
                           f"({cand_slice['pass@1']:.3f} vs {champ_slice['pass@1']:.3f}), beyond {why}{first}")
        else:
            reasons.append(f"{name}: {slice_delta:+.3f} within {why}{first}")
    return holds, reasons, slice_deltas


def monitor_reason(monitor: Mapping[str, Any]) -> str:
    """The gate's words for one failing monitor, e.g. "monitor anomaly_rates (version 1) failed: <its
    message> (value 0.400 > fail 0.150)"."""
    value, fail = monitor.get("value"), monitor.get("fail")
    figures = f" (value {value:.3f} > fail {fail:g})" if value is not None and fail is not None else ""
    return f"monitor {monitor['name']} (version {monitor['version']}) failed: {monitor['message'].rstrip('.')}{figures}"
