"""The registry of monitors: each module gives NAME, VERSION, DEFAULT thresholds and ``check``.

Which monitors there are, and in which order they run, is closedloop/monitor_catalog.py's table (the
names params.yaml's monitors.block_promotion and monitors.thresholds are checked against). A new monitor
is a new module here, one line in the catalog and its import below; a module the catalog names but this
file does not import, or the reverse, fails at import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from closedloop.monitor_catalog import MONITORS as CATALOG
from closedloop.monitor_catalog import WARN_ONLY_MONITORS
from closedloop.monitors import (
    anomaly_rates,
    canary,
    episode_gaming,
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


# Imported here, not loaded by name from the catalog's entries: the import walk that derives each DVC
# stage's code dependencies (closedloop/pipeline.py) sees these lines.
_MODULES: dict[str, ModuleType] = {module.__name__: module for module in (
    anomaly_rates, canary, episode_gaming, format_only_wins, grpo_health, length_inflation, proxy_gold_divergence,
    reward_shift, verifier_shift,
)}


def _entry(name: str, entry: str) -> Monitor:
    """The monitor the catalog lists as ``name`` → ``entry``, checked against its module."""
    module = _MODULES.get(entry)
    if module is None:
        raise ImportError(f"monitor {name!r}: closedloop/monitor_catalog.py names {entry}, which "
                          "closedloop/monitors/registry.py does not import")
    if module.NAME != name:
        raise ImportError(f"monitor {name!r}: {entry} names itself {module.NAME!r}")
    if (module.DEFAULT.fail is None) != (name in WARN_ONLY_MONITORS):
        raise ImportError(f"monitor {name!r}: its default fail threshold ({module.DEFAULT.fail}) disagrees with "
                          "WARN_ONLY_MONITORS of closedloop/monitor_catalog.py (the warn-only monitors)")
    return Monitor(module.NAME, module.VERSION, module.DEFAULT, module.check)


_UNLISTED = sorted(set(_MODULES) - set(CATALOG.values()))
if _UNLISTED:
    raise ImportError(f"closedloop/monitors/registry.py imports {_UNLISTED}, which closedloop/monitor_catalog.py "
                      "does not list")
MONITORS: tuple[Monitor, ...] = tuple(_entry(name, entry) for name, entry in CATALOG.items())
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
