"""canary: the same stored completions scored again; any change means a verifier changed, not the model.

The reward stage scores a fixed canary set (benchmark references and blank answers) with today's
verifiers (data/batch/canary_check.jsonl). Rows are matched to the previous iteration's by
canary_id; the value is the number whose reward or verdict changed, and by default one fails.
"""

from __future__ import annotations

from collections import defaultdict

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, judged, skipped

NAME = "canary"
VERSION = "1"
DEFAULT = Threshold(warn=0.0, fail=0.0)
TOLERANCE = 1e-6  # rewards are rounded to 6 places when written


def _changed(old: dict, new: dict) -> bool:
    if bool(old.get("passed")) != bool(new.get("passed")) or old.get("status") != new.get("status"):
        return True
    a, b = old.get("reward"), new.get("reward")
    if a is None or b is None:
        return a is not b
    return abs(float(a) - float(b)) > TOLERANCE


def check(current: IterationData, history: list[IterationData], threshold: Threshold) -> MonitorResult:
    if not current.canary:
        return skipped(NAME, VERSION, threshold, f"{current.label} has no canary rows")
    if not history or not history[-1].canary:
        return skipped(NAME, VERSION, threshold, "no previous canary check to compare with")
    previous = history[-1]
    # a canary of an environment params.yaml no longer knows is "skipped": nothing to compare it with
    before = {row["canary_id"]: row for row in previous.canary if row.get("status") != "skipped"}
    now = [row for row in current.canary if row.get("status") != "skipped"]
    matched = [(before[row["canary_id"]], row) for row in now if row["canary_id"] in before]
    if not matched:
        return skipped(NAME, VERSION, threshold, f"no canary_id in common with {previous.label} "
                       "(the canary set changed)")
    changed_by_env: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    for old, new in matched:
        if _changed(old, new):
            changed_by_env[str(new.get("env"))].append((old, new))
    figures = {"compared": len(matched), "unmatched": len(now) - len(matched)}
    for env, pairs in sorted(changed_by_env.items()):
        figures[f"{env}.changed"] = len(pairs)
    changed = sum(len(pairs) for pairs in changed_by_env.values())
    if not changed:
        return judged(NAME, VERSION, 0, threshold, figures,
                      f"all {len(matched)} canary completions score as in {previous.label}")
    said = []
    for env, pairs in sorted(changed_by_env.items()):
        versions_before = sorted({str(old.get("verifier_version"))[:8] for old, _ in pairs})
        versions_now = sorted({str(new.get("verifier_version"))[:8] for _, new in pairs})
        said.append(f"{env} {len(pairs)} (verifier {'/'.join(versions_before)} -> {'/'.join(versions_now)})")
    return judged(NAME, VERSION, changed, threshold, figures,
                  f"{changed} of {len(matched)} canary completions scored differently from {previous.label}: "
                  + "; ".join(said))
