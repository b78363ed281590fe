"""The one table of monitors: each module gives NAME, VERSION, DEFAULT thresholds and ``check``.

A new monitor is a new module here and one line in MONITORS (and its name in config.MONITOR_NAMES,
which params.yaml's monitors.block_promotion and monitors.thresholds are checked against).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from closedloop.monitors import (
    anomaly_rates,
    canary,
    format_only_wins,
    grpo_health,
    length_inflation,
    proxy_gold_divergence,
    reward_shift,
    verifier_shift,
)
from closedloop.monitors.base import IterationData, MonitorResult, Threshold, skipped

if TYPE_CHECKING:
    from closedloop.config import MonitorsParams


@dataclass(frozen=True)
class Monitor:
    name: str
    version: str
    default: Threshold
    check: Callable[[IterationData, list[IterationData], Threshold], MonitorResult]


def _entry(module: ModuleType) -> Monitor:
    return Monitor(module.NAME, module.VERSION, module.DEFAULT, module.check)


MONITORS: tuple[Monitor, ...] = tuple(_entry(module) for module in (
    reward_shift, verifier_shift, proxy_gold_divergence, length_inflation,
    format_only_wins, grpo_health, anomaly_rates, canary,
))
BY_NAME: dict[str, Monitor] = {monitor.name: monitor for monitor in MONITORS}


def run_monitors(current: IterationData, history: list[IterationData],
                 settings: "MonitorsParams") -> list[MonitorResult]:
    """Every registered monitor over ``current`` and ``history`` (oldest first), in the registry's order."""
    results = []
    for monitor in MONITORS:
        given = settings.thresholds.get(monitor.name)
        threshold = Threshold(given.warn, given.fail) if given is not None else monitor.default
        if not settings.enabled:
            results.append(skipped(monitor.name, monitor.version, threshold, "monitors.enabled is false"))
            continue
        try:
            result = monitor.check(current, list(history), threshold)
        except Exception as error:  # name the monitor: a bad record otherwise reads as a stage bug
            raise RuntimeError(f"monitor {monitor.name} (version {monitor.version}) failed on "
                               f"{current.label}: {error}") from error
        results.append(result)
    return results
