"""verifier_shift: did an environment's verifier change between iterations, and what did it do to the rewards?

Each reward row names the verifier version that scored it (``verifier:<env>`` in its sources). An
environment whose version differs from the previous iteration's batch is reported with the shift of
its reward distribution (KS, PSI, mean) across the two model versions: a reward that moved with the
verifier did not move because of the model. The value is the number of environments whose verifier
changed; by default any change warns and none fails (a verifier change is often intended), and the
canary monitor tells whether the change altered any verdict.
"""

from __future__ import annotations

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, judged, skipped
from closedloop.monitors.rows import enough, groups, rewards, scored, sources
from closedloop.monitors.stats import ks_statistic, mean, psi

NAME = "verifier_shift"
VERSION = "1"
DEFAULT = Threshold(warn=0.0, fail=None)


def _versions(rows: list[dict], env: str) -> set[str]:
    return {str(version) for row in rows if (version := sources(row).get(f"verifier:{env}")) is not None}


def check(current: IterationData, history: list[IterationData], threshold: Threshold) -> MonitorResult:
    if not history:
        return skipped(NAME, VERSION, threshold, "no previous iteration to compare the verifier versions with")
    previous = history[-1]
    now_groups, before_groups = groups(scored(current.rewards)), groups(scored(previous.rewards))
    figures: dict[str, float] = {}
    changed: list[str] = []
    compared = 0
    for env, rows in now_groups.items():
        if env == "all" or env not in before_groups:
            continue
        now, before = _versions(rows, env), _versions(before_groups[env], env)
        if not now or not before:
            continue  # rows without versions (an old batch): nothing to compare
        compared += 1
        # every version the environment has had over the history: the verifier across model versions
        seen = set(now) | set(before)
        for old in history[:-1]:
            seen |= _versions(old.rewards, env)
        figures[f"{env}.versions_seen"] = len(seen)
        figures[f"{env}.changed"] = float(now != before)
        if now == before:
            continue
        changed.append(f"{env} {'/'.join(sorted(v[:8] for v in before))} -> {'/'.join(sorted(v[:8] for v in now))}")
        new, old = rewards(rows), rewards(before_groups[env])
        if old and new:
            figures[f"{env}.reward_mean_delta"] = round(mean(new) - mean(old), 6)
        if enough(new, old):
            figures[f"{env}.ks"], figures[f"{env}.psi"] = round(ks_statistic(old, new), 6), round(psi(old, new), 6)
    if not compared:
        return skipped(NAME, VERSION, threshold, f"no environment's rows name a verifier version in both this "
                       f"batch and {previous.label}")
    if not changed:
        return judged(NAME, VERSION, 0, threshold, figures,
                      f"no verifier changed since {previous.label} ({compared} environments compared)")
    shifts = [f"{env} reward mean {figures[key]:+.3g}" for env in sorted(e.split(" ")[0] for e in changed)
              if (key := f"{env}.reward_mean_delta") in figures]
    return judged(NAME, VERSION, len(changed), threshold, figures,
                  f"verifier changed since {previous.label}: {'; '.join(changed)}"
                  + (f" ({', '.join(shifts)})" if shifts else ""))
