"""anomaly_rates: the share of samples per environment stopped by a limit or lost to the sandbox.

Counted from the reward rows' status (closedloop/sandbox/records.py STATUSES): timeouts, memory
kills, output-limit hits, process kills (killed) and infrastructure errors; any other status whose
name says limit, timeout or killed (a limit added later) counts under its own name. Every other
status (passed, failed, error, an environment's own such as format_error) is the model's answer
being judged, not an anomaly. The value is the largest rise of one rate against the previous
iteration's, per environment and all pooled, counted when beyond noise (a two-proportion test at
stats.SIGNIFICANCE_Z); with no previous iteration, the largest rate over 8 or more rows.
"""

from __future__ import annotations

from collections import Counter

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, judged, skipped
from closedloop.monitors.rows import MIN_ROWS, groups
from closedloop.monitors.stats import SIGNIFICANCE_Z, proportion_rise_z

NAME = "anomaly_rates"
VERSION = "1"
DEFAULT = Threshold(warn=0.05, fail=0.15)
KNOWN = ("timeout", "memory", "output_limit", "killed", "infra_error")
WORDS = ("limit", "timeout", "killed")


def kind(status: object) -> str | None:
    """The anomaly a status is, or None for a judged answer."""
    status = str(status)
    return status if status in KNOWN or any(word in status for word in WORDS) else None


def counts(rows: list[dict]) -> dict[str, tuple[Counter, int]]:
    """{env or all: (anomaly counts, rows)}."""
    return {env: (Counter(k for row in env_rows if (k := kind(row.get("status"))) is not None), len(env_rows))
            for env, env_rows in groups(rows).items()}


def check(current: IterationData, history: list[IterationData], threshold: Threshold) -> MonitorResult:
    if not current.rewards:
        return skipped(NAME, VERSION, threshold, f"{current.label} has no reward rows")
    now = counts(current.rewards)
    before = counts(history[-1].rewards) if history and history[-1].rewards else {}
    figures: dict[str, float] = {}
    worst: tuple[float, str, float, float | None] = (0.0, "", 0.0, None)  # (rise, env/anomaly, rate, rate before)
    for env, (hits, n) in now.items():
        old_hits, old_n = before.get(env, (Counter(), 0))
        for name in sorted(set(KNOWN) | set(hits) | set(old_hits)):
            rate = hits[name] / n
            figures[f"{env}.{name}"] = round(rate, 6)
            if old_n:
                old_rate = old_hits[name] / old_n
                figures[f"{env}.{name}_jump"] = round(rate - old_rate, 6)
                counted = proportion_rise_z(hits[name], n, old_hits[name], old_n) > SIGNIFICANCE_Z
                rise = rate - old_rate
            else:
                old_rate, counted, rise = None, n >= MIN_ROWS, rate
            if counted and rise > worst[0]:
                worst = (rise, f"{env}/{name}", rate, old_rate)
    rise, key, rate, old_rate = worst
    against = f"against {history[-1].label}" if before else "with no previous iteration to compare with"
    if not key:
        return judged(NAME, VERSION, 0.0, threshold, figures, f"no anomaly rate rose beyond noise {against}")
    was = f" (was {old_rate:.1%})" if old_rate is not None else ""
    return judged(NAME, VERSION, rise, threshold, figures, f"{key} at {rate:.1%}{was} {against}")
