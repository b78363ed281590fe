"""What `dvc plots show` and `dvc plots diff` draw: small JSON files under metrics/plots/, their data
computed here from a stage's records, and their declarations (the top-level ``plots:`` of dvc.yaml).

A stage lists its plot files in the stage table (pipeline.py, ``StageSpec.plots``); ``run_stage`` writes
them after the stage function, from that stage's own inputs and outputs, so `dvc repro` and a Prefect
run write the same bytes. They are outs with ``cache: false``: git keeps them with each experiment,
which is what `dvc plots diff <exp1> <exp2>` reads.

The data functions are pure (records in, rows out); ``write_plot`` does the reading and writing.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Callable

from closedloop.grading import BUCKETS
from closedloop.io import read_json, read_jsonl, write_json
from closedloop.workspace import METRICS_DIR, Workspace

PLOTS_DIR = f"{METRICS_DIR}/plots"
BENCHMARK = f"{PLOTS_DIR}/benchmark.json"  # this revision: pass@1 per environment, champion vs candidate
HISTORY = f"{PLOTS_DIR}/history.json"  # every iteration so far: the candidate's pass@1 per environment
REWARDS = f"{PLOTS_DIR}/rewards.json"  # this batch: reward histogram per environment
BUCKETS_FILE = f"{PLOTS_DIR}/buckets.json"  # this batch: samples per grading bucket and environment

# The history is the one plot file that reads its own previous content: an out with `persist: true`,
# so DVC leaves it in place when the evaluate stage reruns, and the stage replaces the rows of the
# current loop.iteration only. Why not written by the version step and committed to git instead: the
# evaluate stage already has the iteration (a param) and the scores (its output), so `dvc repro` and a
# Prefect run write it the same way, dvc.lock records its hash, and `dvc status` stays clean; at any
# saved experiment the file holds the iterations up to that one, and rerunning that iteration writes
# the same bytes again.
PERSISTENT = frozenset({HISTORY})

REWARD_BINS = 10
OVERALL = "overall"


# -- the data, from plain records ------------------------------------------------------------------
def benchmark_rows(evaluation: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (environment, model): pass@1 of the champion and the candidate on the benchmark,
    the whole benchmark first as ``overall``. ``evaluation`` is data/reports/evaluation.json."""
    rows = []
    for model in ("champion", "candidate"):
        summary = evaluation[model]["summary"]
        rows.append({"env": OVERALL, "model": model, "pass@1": summary["overall"]["pass@1"]})
        rows += [{"env": env, "model": model, "pass@1": figures["pass@1"]}
                 for env, figures in sorted(summary.get("envs", {}).items())]
    return rows


def history_rows(previous: list[dict[str, Any]], iteration: int, evaluation: dict[str, Any]) -> list[dict[str, Any]]:
    """``previous`` with the rows of ``iteration`` replaced by this evaluation's: per environment (and
    ``overall``) the candidate's pass@1, and the champion's it was measured against. Sorted by
    iteration, then environment, so rerunning an iteration writes the same bytes."""
    scores = {(row["env"], row["model"]): row["pass@1"] for row in benchmark_rows(evaluation)}
    envs = [env for env, model in scores if model == "candidate"]
    current = [{"iteration": iteration, "env": env, "pass@1": scores[env, "candidate"],
                "champion_pass@1": scores[env, "champion"]} for env in envs]
    kept = [row for row in previous if row["iteration"] != iteration]
    return sorted(kept + current, key=lambda row: (row["iteration"], row["env"] != OVERALL, row["env"]))


def reward_histogram(rewards: list[dict[str, Any]], bins: int = REWARD_BINS) -> list[dict[str, Any]]:
    """Samples per reward bin and environment, ``bins`` equal bins over [0, 1] (a reward is a weighted
    mean of components in [0, 1]); every bin is listed, empty ones with 0, so two revisions compare bin
    by bin. A reward of exactly 1 falls in the last bin; one outside [0, 1] in the nearest end bin."""
    counts: Counter[tuple[str, int]] = Counter()
    for row in rewards:
        counts[row["env"], min(bins - 1, max(0, int(float(row["reward"]) * bins)))] += 1
    return [{"env": env, "bin": f"{index / bins:.1f}-{(index + 1) / bins:.1f}", "low": round(index / bins, 6),
             "count": counts[env, index]}
            for env in sorted({row["env"] for row in rewards}) for index in range(bins)]


def bucket_rows(graded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Samples per grading bucket (positive, partial, error) and environment, every bucket listed."""
    counts = Counter((row["env"], row["bucket"]) for row in graded)
    return [{"env": env, "bucket": bucket, "count": counts[env, bucket]}
            for env in sorted({row["env"] for row in graded}) for bucket in BUCKETS]


# -- reading the stage's files and writing the plot file -------------------------------------------
def _benchmark(ws: Workspace, iteration: int) -> list[dict]:
    return benchmark_rows(read_json(ws.evaluation))


def _history(ws: Workspace, iteration: int) -> list[dict]:
    path = ws.path(HISTORY)
    previous = read_json(path) if path.exists() else []
    return history_rows(previous, iteration, read_json(ws.evaluation))


def _rewards(ws: Workspace, iteration: int) -> list[dict]:
    return reward_histogram(read_jsonl(ws.rewards, required=("env", "reward")))


def _buckets(ws: Workspace, iteration: int) -> list[dict]:
    return bucket_rows(read_jsonl(ws.graded, required=("env", "bucket")))


WRITERS: dict[str, Callable[[Workspace, int], list[dict]]] = {
    BENCHMARK: _benchmark, HISTORY: _history, REWARDS: _rewards, BUCKETS_FILE: _buckets,
}


def write_plot(ws: Workspace, path: str, iteration: int) -> Path:
    """Write plot file ``path`` (one of WRITERS) of the workspace, for loop iteration ``iteration``."""
    if path not in WRITERS:
        raise KeyError(f"no plot data is defined for {path!r}; plot files: {', '.join(sorted(WRITERS))}")
    target = ws.path(path)
    write_json(target, WRITERS[path](ws, iteration))
    return target


# -- how DVC draws them -------------------------------------------------------------------------------
# Vega-Lite templates of our own (DVC's built-in ones colour only by revision, so one line per
# environment needs a template that colours by the `env` field). `closedloop init` writes them to
# .dvc/plots/, where DVC looks a template up by name. `rev` is the revision DVC adds to every point:
# in `dvc plots diff` it tells the experiments apart (dashes for lines, side by side for bars).
LINES_TEMPLATE = "closedloop_lines_by_env"
BARS_TEMPLATE = "closedloop_bars_by_env"
_DATA, _TITLE = "<DVC_METRIC_DATA>", "<DVC_METRIC_TITLE>"
_X, _Y, _X_LABEL, _Y_LABEL = "<DVC_METRIC_X>", "<DVC_METRIC_Y>", "<DVC_METRIC_X_LABEL>", "<DVC_METRIC_Y_LABEL>"
TEMPLATES: dict[str, dict[str, Any]] = {
    LINES_TEMPLATE: {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": _DATA},
        "title": _TITLE,
        "width": 400, "height": 260,
        "mark": {"type": "line", "point": True},
        "encoding": {
            "x": {"field": _X, "type": "quantitative", "title": _X_LABEL, "axis": {"tickMinStep": 1}},
            "y": {"field": _Y, "type": "quantitative", "title": _Y_LABEL, "scale": {"domain": [0, 1]}},
            "color": {"field": "env", "type": "nominal", "title": "environment"},
            "strokeDash": {"field": "rev", "type": "nominal", "title": "revision"},
            "tooltip": [{"field": "rev"}, {"field": "env"}, {"field": _X}, {"field": _Y}],
        },
    },
    BARS_TEMPLATE: {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": _DATA},
        "title": _TITLE,
        "facet": {"column": {"field": "env", "type": "nominal", "title": "environment"}},
        "spec": {
            "width": 180, "height": 200,
            "mark": "bar",
            "encoding": {
                "x": {"field": _X, "type": "nominal", "title": _X_LABEL},
                "xOffset": {"field": "rev"},
                "y": {"field": _Y, "type": "quantitative", "title": _Y_LABEL},
                "color": {"field": "rev", "type": "nominal", "title": "revision"},
                "tooltip": [{"field": "rev"}, {"field": "env"}, {"field": _X}, {"field": _Y}],
            },
        },
    },
}

# The top-level `plots:` of dvc.yaml (DVC 3): a title, the template, the x field and {file: y field}.
DEFINITIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("pass@1 per environment across iterations (candidate)",
     {"template": LINES_TEMPLATE, "x": "iteration", "y": {HISTORY: "pass@1"}}),
    ("benchmark pass@1 per environment, champion vs candidate",
     {"template": BARS_TEMPLATE, "x": "model", "y": {BENCHMARK: "pass@1"}}),
    ("reward histogram per environment",
     {"template": BARS_TEMPLATE, "x": "bin", "x_label": "reward", "y": {REWARDS: "count"}, "y_label": "samples"}),
    ("grading buckets per environment",
     {"template": BARS_TEMPLATE, "x": "bucket", "y": {BUCKETS_FILE: "count"}, "y_label": "samples"}),
)


def write_templates(root: Path | str) -> list[Path]:
    """Write the templates to ``root``/.dvc/plots/ (ours: an older copy is replaced)."""
    import json

    directory = Path(root) / ".dvc" / "plots"
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in TEMPLATES.items():
        path = directory / f"{name}.json"
        text = json.dumps(content, indent=2) + "\n"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written
