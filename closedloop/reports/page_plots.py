"""The report page's figures (closedloop/reports/page.py): plain numbers in, PNG bytes out.

matplotlib is imported inside the functions (its import is ~0.5 s) and figures are bare
``matplotlib.figure.Figure`` objects rendered by the Agg canvas, so the process-wide pyplot backend
is never touched (the MLflow histogram in lineage/tracking.py does the same).
"""

from __future__ import annotations

import io
from typing import Any

OVERALL = "overall"
BINS = 10  # rewards and components live in [0, 1]: ten bins of 0.1, as the DVC reward plot has


def _colours(names: list[str]) -> dict[str, Any]:
    """One colour per name, the same in every figure of a page (sorted names, tab10)."""
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    return {name: palette(index % 10) for index, name in enumerate(sorted(names))}


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    # Margins set by hand (subplots_adjust below), not layout="constrained": the constrained layout
    # solver took ~70% of the page's render time for the 12-panel grid (3.4 of 4.7 s on a busy 2-core machine).
    return Figure(figsize=(width, height), dpi=100)


def _margins(fig, width: float, height: float, right_in: float, *, top_in: float = 0.55, bottom_in: float = 0.55,
             left_in: float = 0.6, wspace: float = 0.25, hspace: float = 0.55) -> None:
    """Fixed margins in inches (room for the legend on the right, the title on top)."""
    fig.subplots_adjust(left=left_in / width, right=1 - right_in / width, top=1 - top_in / height,
                        bottom=bottom_in / height, wspace=wspace, hspace=hspace)


def png(fig) -> bytes:
    """The figure as PNG bytes (Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def pass_at_1_lines(points: dict[str, list[tuple[int, float]]], champion: list[tuple[int, float]],
                    title: str, labels: dict[int, str], xlabel: str = "iteration (candidate model)") -> bytes:
    """pass@1 across iterations, one line per environment (or slice): ``points`` name → [(iteration,
    pass@1)], ``overall`` drawn thick and black; ``champion`` the overall pass@1 of the model each
    candidate was measured against (dashed); ``labels`` iteration → its tick text."""
    width, height = (6.6, 3.6) if len(points) <= 10 else (8.8, 3.6)  # room for a two-column legend of slices
    fig = _figure(width, height)
    _margins(fig, width, height, right_in=2.0 if len(points) <= 10 else 4.0, top_in=0.4, bottom_in=0.95, left_in=0.75)
    ax = fig.add_subplot()
    # A slice ("code/edge") takes its environment's colour and a line style per slice kind.
    colours = _colours(sorted({name.split("/")[0] for name in points if name != OVERALL}))
    kinds = sorted({name.split("/", 1)[1] for name in points if "/" in name})
    styles = dict(zip(kinds, ("-", "--", ":", "-.") * 4))
    for name, series in sorted(points.items(), key=lambda item: (item[0] == OVERALL, item[0])):
        xs, ys = zip(*sorted(series)) if series else ((), ())
        if name == OVERALL:
            ax.plot(xs, ys, marker="o", color="black", linewidth=2.6, label="overall", zorder=3)
        else:
            env, _, kind = name.partition("/")
            ax.plot(xs, ys, marker="o", markersize=4, color=colours[env], linestyle=styles.get(kind, "-"),
                    linewidth=1.4, label=name)
    if champion:
        xs, ys = zip(*sorted(champion))
        ax.plot(xs, ys, linestyle="--", color="grey", linewidth=1.4, label="champion (overall)")
    ticks = sorted(labels)
    ax.set_xticks(ticks, [labels[i] for i in ticks])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("benchmark pass@1")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8 if len(points) > 8 else 9,
              ncols=2 if len(points) > 10 else 1)
    return png(fig)


def component_histograms(values: dict[str, dict[str, list[float]]]) -> bytes:
    """One panel per reward component: its values in the batch, stacked by environment. ``values``:
    component → env → values (components a row's verifier does not give are left out by the caller)."""
    components = sorted(values)
    columns = min(4, max(1, len(components)))
    rows = -(-len(components) // columns) if components else 1
    width, height = 2.6 * columns + 1.6, 2.1 * rows + 0.7
    fig = _figure(width, height)
    _margins(fig, width, height, right_in=1.6, top_in=0.65, bottom_in=0.35)
    envs = sorted({env for per_env in values.values() for env in per_env})
    colours = _colours(envs)
    axes = fig.subplots(rows, columns, squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= len(components):
            ax.set_axis_off()
            continue
        name = components[index]
        present = [env for env in envs if values[name].get(env)]
        ax.hist([values[name][env] for env in present], bins=BINS, range=(0.0, 1.0), stacked=True,
                color=[colours[env] for env in present], label=present)
        ax.set_title(name, fontsize=10)
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=8)
        if index % columns == 0:
            ax.set_ylabel("samples", fontsize=9)
    handles = [_patch(colours[env]) for env in envs]
    fig.legend(handles, envs, loc="center right", frameon=False, fontsize=9, title="environment")
    fig.suptitle("reward components in this batch (0 … 1)", fontsize=11)
    return png(fig)


def _patch(colour):
    from matplotlib.patches import Patch

    return Patch(color=colour)


def length_histograms(lengths: dict[str, dict[str, list[int]]], unit: str) -> bytes:
    """Completion lengths of passed and failed samples, one panel per environment and one for the
    whole batch: ``lengths`` env → {"passed": [...], "failed": [...]}."""
    envs = sorted(lengths)
    panels = [(OVERALL, {kind: [n for env in envs for n in lengths[env].get(kind, [])]
                         for kind in ("passed", "failed")})] + [(env, lengths[env]) for env in envs]
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    width, height = 3.0 * columns + 0.6, 2.2 * rows + 0.9
    fig = _figure(width, height)
    _margins(fig, width, height, right_in=0.2, top_in=0.65, bottom_in=0.6)
    axes = fig.subplots(rows, columns, squeeze=False)
    top = max([n for _, kinds in panels for values in kinds.values() for n in values] or [1])
    colours = {"passed": "#2ca02c", "failed": "#d62728"}
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.set_axis_off()
            continue
        name, kinds = panels[index]
        for kind in ("failed", "passed"):
            data = kinds.get(kind, [])
            if data:
                ax.hist(data, bins=12, range=(0, top), alpha=0.6, color=colours[kind],
                        label=f"{kind} ({len(data)})")
        ax.set_title(name, fontsize=10, fontweight="bold" if name == OVERALL else "normal")
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8, frameon=False)
        if index % columns == 0:
            ax.set_ylabel("samples", fontsize=9)
        if index // columns == rows - 1:
            ax.set_xlabel(f"completion length ({unit})", fontsize=9)
    fig.suptitle("completion length of passed and failed samples", fontsize=11)
    return png(fig)
