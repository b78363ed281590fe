"""The records monitors read and return, and the one function that runs them all.

A monitor is a small pure function ``(current, history, threshold) -> MonitorResult`` over plain
records of one iteration's batch (:class:`IterationData`) and the previous iterations' batches
(oldest first). Its value is higher-is-worse and is compared with ``threshold``: above ``warn`` it
warns, above ``fail`` it fails. A monitor that lacks its inputs says "skipped" and why, never ok.
Each monitor has a version, bumped when what it computes changes, so a verdict names the check
that produced it (as reward components do).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Verdict = Literal["ok", "warn", "fail", "skipped"]

# metrics/monitors.json holds numbers only: each verdict as a code (DVC and MLflow compare numbers).
VERDICT_CODES: dict[str, int] = {"skipped": -1, "ok": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class IterationData:
    """Plain records of one iteration's batch, as the monitors stage read them."""

    iteration: int
    experiment: str | None  # its DVC experiment name; None for the batch in the workspace now
    samples: list[dict] = field(default_factory=list)  # data/batch/samples.jsonl rows
    rewards: list[dict] = field(default_factory=list)  # data/batch/rewards.jsonl rows
    rollouts: list[dict] = field(default_factory=list)  # data/batch/rollouts.jsonl rows ([] when absent)
    train: dict = field(default_factory=dict)  # metrics/train.json ({} when absent)
    evaluation: dict = field(default_factory=dict)  # data/reports/evaluation.json ({} when absent)
    canary: list[dict] = field(default_factory=list)  # data/batch/canary_check.jsonl rows ([] when absent)

    @property
    def label(self) -> str:
        return self.experiment or f"iteration {self.iteration}"


@dataclass(frozen=True)
class Threshold:
    warn: float
    fail: float | None  # None: the monitor only ever warns

    def judge(self, value: float) -> Verdict:
        if self.fail is not None and value > self.fail:
            return "fail"
        return "warn" if value > self.warn else "ok"


@dataclass(frozen=True)
class MonitorResult:
    name: str
    version: str
    verdict: Verdict
    value: float | None  # the headline figure compared with the thresholds (None: skipped)
    warn: float | None
    fail: float | None
    figures: dict[str, float]  # the numbers behind it, flat dotted keys
    message: str  # one sentence a person reads

    def __post_init__(self) -> None:
        if self.verdict not in VERDICT_CODES:
            raise ValueError(f"monitor {self.name}: verdict {self.verdict!r} is not one of {sorted(VERDICT_CODES)}")
        if (self.value is None) != (self.verdict == "skipped"):
            raise ValueError(f"monitor {self.name}: a skipped result has no value and only a skipped one ({self.value!r})")

    def to_dict(self) -> dict:
        return asdict(self)


def judged(name: str, version: str, value: float, threshold: Threshold, figures: dict[str, float],
           message: str) -> MonitorResult:
    """A result whose verdict is ``value`` against ``threshold``."""
    value = float(value)
    return MonitorResult(name, version, threshold.judge(value), value, threshold.warn, threshold.fail,
                         {key: float(number) for key, number in figures.items()}, message)


def skipped(name: str, version: str, threshold: Threshold, reason: str,
            figures: dict[str, float] | None = None) -> MonitorResult:
    return MonitorResult(name, version, "skipped", None, threshold.warn, threshold.fail,
                         {key: float(number) for key, number in (figures or {}).items()}, reason)


def report(iteration: int, results: list[MonitorResult], block_promotion: list[str]) -> dict:
    """data/reports/monitors.json: every result, the failing monitors, and those of them that hold the gate."""
    failing = [result.name for result in results if result.verdict == "fail"]
    return {
        "iteration": iteration,
        "monitors": [result.to_dict() for result in results],
        "failing": failing,
        "holding": [name for name in failing if name in block_promotion],
    }


def numbers(results: list[MonitorResult]) -> dict[str, float]:
    """metrics/monitors.json's numbers: per monitor its value, verdict code and figures."""
    out: dict[str, float] = {}
    for result in results:
        if result.value is not None:
            out[f"{result.name}.value"] = result.value
        out[f"{result.name}.verdict_code"] = VERDICT_CODES[result.verdict]
        for key, number in result.figures.items():
            out[f"{result.name}.{key}"] = number
    return out
