"""Versioned checks over a batch and its history (drift, reward hacking, training health) that say
ok / warn / fail and can hold promotion. Pure: records in, results out; the monitors stage reads and writes."""

from closedloop.monitors.base import VERDICT_CODES, IterationData, MonitorResult, Threshold, numbers, report
from closedloop.monitors.registry import run_monitors

__all__ = ["VERDICT_CODES", "IterationData", "MonitorResult", "Threshold", "numbers", "report", "run_monitors"]
