"""The small files a stage leaves beside its outputs: what a stage returns, split so DVC can compare it.

    metrics/<stage>.json         numbers only (nested dicts of numbers; booleans count as numbers): what
                                 `dvc metrics show/diff` and `dvc exp show/diff` compare. DVC refuses a
                                 metrics file that holds a list, and then shows none of that revision's.
    metrics/info/<stage>.json    everything else the stage said (names, versions, reasons, lists, nulls):
                                 an out of the stage, git-tracked like the metrics, never read as one.
    metrics/timing/<stage>.json  wall clock, CPU and memory of the run, and the stage's throughput figures
                                 (its keys ending in _per_s): a metrics file of its own, so that what
                                 changes on every run stays out of the comparison of data and scores.

``stage_result`` puts the first two back together: the dict the stage function returned.
Everything here lives under metrics/, which the version step commits with each experiment.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path
from typing import Any

from closedloop.io import read_json
from closedloop.nested import deep_merge
from closedloop.workspace import METRICS_DIR

INFO_DIR = f"{METRICS_DIR}/info"
TIMING_DIR = f"{METRICS_DIR}/timing"
TIMING_KEYS = ("seconds", "cpu_seconds", "peak_rss_mb")  # and gpu_peak_mb where CUDA was used
RATE_SUFFIX = "_per_s"  # a stage's throughput figures; they go to the timing file beside TIMING_KEYS


def metrics_path(stage: str) -> str:
    return f"{METRICS_DIR}/{stage}.json"


def info_path(stage: str) -> str:
    return f"{INFO_DIR}/{stage}.json"


def timing_path(stage: str) -> str:
    return f"{TIMING_DIR}/{stage}.json"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # bool is an int: DVC shows it, and diffs it as 0/1


def split_numbers(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(numbers, rest): the numeric leaves of ``data`` with the dicts that hold them, and everything
    else with the dicts that hold that. A dict with both kinds appears on both sides; an empty dict
    stays with the numbers. ``merge(*split_numbers(d)) == d`` for any JSON object ``d``."""
    numbers: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            inner_numbers, inner_rest = split_numbers(value)
            if inner_numbers or not inner_rest:
                numbers[key] = inner_numbers
            if inner_rest:
                rest[key] = inner_rest
        elif _is_number(value):
            numbers[key] = value
        else:
            rest[key] = value
    return numbers, rest


def split_rates(numbers: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """(numbers, rates): the figures measured against the wall clock (a key ending in ``_per_s``:
    tokens, samples or verifications per second) taken out of ``numbers``, as flat keys for the
    timing file ("verifications_per_s/code"). They change on every run, like the seconds."""
    kept: dict[str, Any] = {}
    rates: dict[str, float] = {}
    for key, value in numbers.items():
        if key.endswith(RATE_SUFFIX):
            if isinstance(value, dict):
                rates.update({f"{key}/{name}": leaf for name, leaf in _leaves(value)})
            else:
                rates[key] = value
        elif isinstance(value, dict):
            inner, inner_rates = split_rates(value)
            kept[key] = inner
            rates.update({f"{key}/{name}": rate for name, rate in inner_rates.items()})
        else:
            kept[key] = value
    return kept, rates


def _leaves(data: dict[str, Any], prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def merge(numbers: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split_numbers`."""
    return deep_merge(numbers, rest)


def stage_result(root: Path | str, stage: str) -> dict[str, Any]:
    """What stage ``stage`` returned when it last ran in the workspace at ``root``: its metrics and its
    info file together ({} for a stage that has not run)."""
    root = Path(root)
    return merge(read_json(root / metrics_path(stage)) if (root / metrics_path(stage)).exists() else {},
                 read_json(root / info_path(stage)) if (root / info_path(stage)).exists() else {})


class StageClock:
    """Wall clock, CPU time and peak memory of one stage run in this process.

    CPU is this process's user+system time plus that of the children it waited for (sandbox workers,
    a training subprocess). Peak RSS is what the kernel reports, the process's peak since it started
    (a Prefect flow running stages one after another reports the highest so far) plus the largest
    child's: an upper bound of what the stage held at once. The GPU figure is CUDA's peak allocation
    during the stage, given only where torch is already loaded and CUDA initialised: importing torch
    just to look would cost seconds and touch a GPU the stage never used.
    """

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._cpu = _cpu_seconds()
        torch = _cuda_torch()
        if torch is not None:
            torch.cuda.reset_peak_memory_stats()

    def figures(self) -> dict[str, float]:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        scale = 1 / 2**20 if sys.platform == "darwin" else 1 / 2**10  # bytes on macOS, KiB on Linux
        figures = {
            "seconds": round(time.perf_counter() - self._started, 3),
            "cpu_seconds": round(_cpu_seconds() - self._cpu, 3),
            "peak_rss_mb": round((own + children) * scale, 1),
        }
        torch = _cuda_torch()
        if torch is not None:
            peak = sum(torch.cuda.max_memory_allocated(device) for device in range(torch.cuda.device_count()))
            figures["gpu_peak_mb"] = round(peak / 2**20, 1)
        return figures


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _cuda_torch():
    """torch, where a stage of this process already imported it and initialised CUDA; else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return None
    return torch
