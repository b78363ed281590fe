"""The one table of monitors: each module gives NAME, VERSION, DEFAULT thresholds and ``check``.

A new monitor is a new module here and one line in MONITORS (and its name in config.MONITOR_NAMES,
which params.yaml's monitors.block_promotion and monitors.thresholds are checked against).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from closedloop.monitors import (anomaly_rates, canary, format_only_wins, grpo_health, length_inflation,
                                 proxy_gold_divergence, reward_shift, verifier_shift)
from closedloop.monitors.base import IterationData, MonitorResult, Threshold


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
