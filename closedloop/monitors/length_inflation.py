"""length_inflation: completions getting longer without getting better (Singhal et al. 2023).

Per environment (and all pooled): Spearman's rho of completion length (characters) with reward, and
the mean length of the failed samples, each against the previous iteration. The value is the
largest of the rise of rho (a reward that has begun to follow length) and the relative rise of the
failed samples' mean length (a policy padding what it cannot solve), each counted only when beyond
noise (stats.SIGNIFICANCE_Z standard errors: Fisher's z for rho, Welch for the mean). A correlation
that was already there (a blank answer is short and scores 0) does not count; only its change does.
"""

from __future__ import annotations

from dataclasses import dataclass

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, judged, skipped
from closedloop.monitors.rows import enough, groups, scored
from closedloop.monitors.stats import SIGNIFICANCE_Z, correlation_rise_z, mean, mean_rise_z, spearman

NAME = "length_inflation"
VERSION = "1"
DEFAULT = Threshold(warn=0.3, fail=0.6)


@dataclass(frozen=True)
class _Lengths:
    lengths: list[int]  # every scored sample's completion length
    failed: list[int]  # the failed samples' lengths
    rho: float | None  # Spearman's rho of length with reward (None: too few or constant)


def _lengths(data: IterationData) -> dict[str, _Lengths]:
    length_of = {s["sample_id"]: len(s.get("completion") or "") for s in data.samples if "sample_id" in s}
    out = {}
    for env, rows in groups(scored(data.rewards)).items():
        rows = [r for r in rows if r.get("sample_id") in length_of and r.get("reward") is not None]
        lengths = [length_of[r["sample_id"]] for r in rows]
        rho = spearman(lengths, [float(r["reward"]) for r in rows]) if enough(rows) else None
        out[env] = _Lengths(lengths, [length_of[r["sample_id"]] for r in rows if not r.get("passed")], rho)
    return out


def check(current: IterationData, history: list[IterationData], threshold: Threshold) -> MonitorResult:
    now = _lengths(current)
    figures: dict[str, float] = {}
    for env, seen in now.items():
        if seen.lengths:
            figures[f"{env}.length"] = round(mean(seen.lengths), 3)
        if seen.rho is not None:
            figures[f"{env}.rho"] = round(seen.rho, 6)
        if seen.failed:
            figures[f"{env}.failed_length"] = round(mean(seen.failed), 3)
    if not history:
        return skipped(NAME, VERSION, threshold, "no previous iteration to compare lengths with", figures)
    previous = history[-1]
    before = _lengths(previous)
    compared = 0
    worst: tuple[float, str] = (0.0, "")
    for env, seen in now.items():
        old = before.get(env)
        if old is None:
            continue
        rises = {}
        if seen.rho is not None and old.rho is not None:
            z = correlation_rise_z(seen.rho, len(seen.lengths), old.rho, len(old.lengths))
            rises["rho_rise"] = (seen.rho - old.rho, z)
        if enough(seen.failed, old.failed) and mean(old.failed) > 0:
            rises["failed_length_rise"] = (mean(seen.failed) / mean(old.failed) - 1, mean_rise_z(seen.failed, old.failed))
        for key, (rise, z) in rises.items():
            compared += 1
            figures[f"{env}.{key}"] = round(rise, 6)
            if z > SIGNIFICANCE_Z and rise > worst[0]:
                worst = (rise, f"{env}.{key}")
    if not compared:
        return skipped(NAME, VERSION, threshold, f"too few samples to compare lengths with {previous.label} "
                       "(fewer than 8 on a side everywhere)", figures)
    value, key = worst
    if not key:
        return judged(NAME, VERSION, 0.0, threshold, figures,
                      f"no length-reward correlation or failed length rose beyond noise against {previous.label}")
    env, what = key.rsplit(".", 1)
    said = (f"failed samples' mean length {value:+.0%}" if what == "failed_length_rise"
            else f"length-reward Spearman rho {value:+.3g}")
    return judged(NAME, VERSION, value, threshold, figures, f"{env}: {said} against {previous.label}")
