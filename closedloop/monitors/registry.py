"""The one table of monitors: a name, a version, default thresholds, and the function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, skipped


@dataclass(frozen=True)
class Monitor:
    name: str
    version: str
    default: Threshold
    check: Callable[[IterationData, list[IterationData], Threshold], MonitorResult]


def _pending(name: str, version: str) -> Callable:
    def check(current, history, threshold):
        return skipped(name, version, threshold, f"{name} is not implemented yet")
    return check


MONITORS: tuple[Monitor, ...] = tuple(
    Monitor(name, "0", Threshold(warn, fail), _pending(name, "0"))
    for name, warn, fail in (
        ("reward_shift", 0.1, 0.25), ("verifier_shift", 0.0, None), ("proxy_gold_divergence", 0.05, 0.15),
        ("length_inflation", 0.3, 0.5), ("format_only_wins", 0.05, 0.15), ("grpo_health", 0.5, 0.8),
        ("anomaly_rates", 0.05, 0.15), ("canary", 0.0, 0.0),
    )
)
