"""reward_shift: has the reward distribution moved since the previous iteration?

Per environment (and all pooled) and per reward component plus the combined reward, the batch is
compared with the previous iteration's batch by the two-sample KS statistic and the PSI. The value
is the largest PSI (conventional thresholds: 0.1 a shift worth a look, 0.25 a large one) among the
distributions whose KS statistic is beyond chance (its critical value at alpha 0.01): PSI's own
noise is about (bins - 1) * (1/n + 1/m), 0.4 for two batches of 20, so on its own it would warn on
every tiny batch. A shift is not a fault by itself (a policy that learns moves its rewards): this
monitor says where to look, and is rarely one that should hold promotion alone.
"""

from __future__ import annotations

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, judged, skipped
from closedloop.monitors.rows import ALL, component_values, enough, fmt, groups, rewards, scored
from closedloop.monitors.stats import ks_critical, ks_statistic, psi

NAME = "reward_shift"
VERSION = "1"
# Warn only by default: a policy that learns moves its rewards (make run's second iteration shows
# PSI 0.8 on extract/fields as the policy improved). Set monitors.thresholds.reward_shift.fail to block on it.
DEFAULT = Threshold(warn=0.1, fail=None)


def _distributions(env: str, rows: list[dict]) -> dict[str, list[float]]:
    # pooled over environments only the combined reward: components of different environments differ
    return {"reward": rewards(rows), **(component_values(rows) if env != ALL else {})}


def check(current: IterationData, history: list[IterationData], threshold: Threshold) -> MonitorResult:
    if not history:
        return skipped(NAME, VERSION, threshold, "no previous iteration to compare the rewards with")
    previous = history[-1]
    now_groups, before_groups = groups(scored(current.rewards)), groups(scored(previous.rewards))
    figures: dict[str, float] = {}
    compared = 0
    worst: tuple[float, str, float] | None = None  # (psi, env/component, ks) of a shift beyond chance
    for env, rows in now_groups.items():
        if env not in before_groups:
            continue
        before = _distributions(env, before_groups[env])
        for component, values in _distributions(env, rows).items():
            old = before.get(component, [])
            if not enough(values, old):
                continue
            compared += 1
            index, ks = psi(old, values), ks_statistic(old, values)
            key = f"{env}/{component}"
            figures[f"{key}.psi"], figures[f"{key}.ks"] = round(index, 6), round(ks, 6)
            if ks > ks_critical(len(old), len(values)) and (worst is None or index > worst[0]):
                worst = (index, key, ks)
    if not compared:
        return skipped(NAME, VERSION, threshold, f"too few scored rows to compare with {previous.label} "
                       f"(fewer than 8 on a side for every environment and component)")
    if worst is None:
        return judged(NAME, VERSION, 0.0, threshold, figures,
                      f"no reward distribution moved beyond chance against {previous.label} "
                      f"({compared} compared by KS)")
    index, key, ks = worst
    return judged(NAME, VERSION, index, threshold, figures,
                  f"reward shift against {previous.label}: largest PSI {fmt(index)} on {key} (KS {fmt(ks)})")
