"""What an iteration's MLflow run holds as metrics: the names, how they group, which come first.

Pure: stage files in, ``{name: value}`` out; lineage.tracking logs them at ``step = iteration``, so
each chart of the experiment draws one point per iteration.

MLflow 3's UI sections charts by the part of a name before its last ``/`` and sorts the sections
alphabetically (runs-charts.types.ts, ``extractChartSectionName``), so the prefix decides where a
figure shows:

    loop/...             the headline, first: the candidate's benchmark pass@1 overall and per
                         environment, the champion's beside it, promoted (0/1), the batch's reward mean
    monitor/<name>       each monitor's value (closedloop/monitors; higher is worse), one chart per
                         monitor across iterations; a skipped monitor has no point that iteration
    stage/<stage>/...    everything else a stage measured, one section per stage
    system/<stage>/...   CPU seconds, peak RSS, peak GPU memory where CUDA ran, and the throughput
                         (tokens_per_s, ...) of each stage: its timing file (stage_files)
    timing/<stage>       each stage's wall-clock seconds, in one section

Left out: figures logged elsewhere already (a stage's own pass@1 and reward mean are the headline,
promote's ``promoted`` is gate's ``promote``, reward's pass rate per environment is grade's), counts
the params decide (tasks per kind, benchmark tasks per slice) and keys named after data (replayed
experiment names), which would add a new metric every iteration. Of the monitors stage only each
monitor's verdict code (-1 skipped, 0 ok, 1 warn, 2 fail) is kept beside the headline value: the
figures behind them (per environment and component) are in metrics/monitors.json and the report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

PASS_AT_1 = "loop/benchmark_pass_at_1"  # the candidate's (the warm start model's at iteration 0)
CHAMPION_PASS_AT_1 = "loop/champion_pass_at_1"  # the model it was compared with, on the same benchmark
PROMOTED = "loop/promoted"
REWARD_MEAN = "loop/reward_mean"

# Per stage, the flattened keys (see _flatten) not logged under stage/<stage>/ (why: see above), as
# regular expressions over the whole key; ENV is one name ("code"), so "x(\.ENV)?" is x overall and
# per environment, while x.<env>.<slice> stays.
_ENV = r"[^.]+"
_LEFT_OUT: dict[str, tuple[str, ...]] = {
    "benchmark": (r"per_slice\..*",),
    "generate": (r"per_kind\..*",),
    "warmstart": (rf"benchmark_pass_at_1(\.{_ENV})?",),
    "evaluate": (rf"candidate_pass_at_1(\.{_ENV})?", r"champion_pass_at_1(\..*)?"),
    "grade": (r"reward_mean",),  # and its pass_rate.<env> is the one kept, not reward's copy
    "reward": (r"reward_mean", rf"per_env\.{_ENV}\.pass_rate"),  # per_env.<env>.reward_mean stays
    "gate": (r"promote",),
    "promote": (r"promoted",),
    "train": (r"replay\..*",),  # examples.replay counts them
    "monitors": (r"[^.]+\.(?!verdict_code$).+",),  # <name>.value is monitor/<name>; see the docstring
}
MONITOR = "monitor/"


def _name(key: str) -> str:
    # MLflow names allow letters, digits, _ - . / and spaces (':' too, except on Windows); '/' is kept
    # for the sections.
    return key.replace("@", "_at_").replace(":", "_")


def _flatten(data: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves as {"a.b.c": value}; a '/' inside a key (a slice, "code/core") becomes '.', so
    that only the prefixes above make sections. Booleans are 0/1; strings, lists and None are not
    figures."""
    out: dict[str, float] = {}
    if isinstance(data, bool) or isinstance(data, (int, float)):
        out[_name(prefix)] = float(data)
    elif isinstance(data, Mapping):
        for key, value in data.items():
            part = str(key).replace("/", ".")
            out.update(_flatten(value, f"{prefix}.{part}" if prefix else part))
    return out


def _left_out(stage: str, key: str) -> bool:
    return any(re.fullmatch(rule, key) for rule in _LEFT_OUT.get(stage, ()))


def stage_figures(stage: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """``stage/<stage>/<key>`` for the numbers in the stage's metrics file, less what is logged
    elsewhere (a ``seconds`` there is the stage's timing: see :func:`timing_figures`)."""
    flat = _flatten({k: v for k, v in metrics.items() if k != "seconds"})
    return {f"stage/{stage}/{key}": value for key, value in flat.items() if not _left_out(stage, key)}


def timing_figures(stage: str, timing: Mapping[str, Any] | None, metrics: Mapping[str, Any]) -> dict[str, float]:
    """``timing/<stage>`` (wall-clock seconds) and ``system/<stage>/<figure>`` for the rest of the
    stage's timing file (CPU seconds, peak RSS, peak GPU memory where CUDA ran, throughput such as
    tokens_per_s); a stage run before timing files existed has only the ``seconds`` of its metrics."""
    flat = _flatten(timing or {})
    seconds = flat.pop("seconds", None)
    if seconds is None and isinstance(metrics.get("seconds"), (int, float)) and not isinstance(metrics["seconds"], bool):
        seconds = float(metrics["seconds"])
    out = {f"timing/{stage}": seconds} if seconds is not None else {}
    out.update({f"system/{stage}/{key}": value for key, value in flat.items()})
    return out


def headline(candidate: Mapping[str, Any], champion: Mapping[str, Any] | None, *, promoted: bool,
             reward_mean: float | None) -> dict[str, float]:
    """The loop/ figures from benchmark summaries (stats.summarize: ``overall`` and ``envs``, each
    with ``pass@1``). ``champion`` is None for the warm start, which nothing was compared with."""
    out = {PROMOTED: float(bool(promoted))}
    for name, summary in ((PASS_AT_1, candidate), (CHAMPION_PASS_AT_1, champion)):
        if summary is None:
            continue
        out[name] = float(summary["overall"]["pass@1"])
        for env, figures in summary.get("envs", {}).items():
            out[f"{name}.{env}"] = float(figures["pass@1"])
    if reward_mean is not None:
        out[REWARD_MEAN] = float(reward_mean)
    return out


def monitor_figures(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``monitor/<name>``: each monitor's value, from metrics/monitors.json (``{name: {value, ...}}``)."""
    return {f"{MONITOR}{name}": float(figures["value"]) for name, figures in metrics.items()
            if isinstance(figures, Mapping) and isinstance(figures.get("value"), (int, float))}


def run_figures(stages: Mapping[str, Mapping[str, Any]], timings: Mapping[str, Mapping[str, Any] | None],
                headline_figures: Mapping[str, float]) -> dict[str, float]:
    """Every figure of one run: the headline, then each stage's figures and timing, in stage order."""
    out = dict(headline_figures)
    for stage, metrics in stages.items():
        if stage == "monitors":
            out.update(monitor_figures(metrics))
        out.update(stage_figures(stage, metrics))
        out.update(timing_figures(stage, timings.get(stage), metrics))
    return out
