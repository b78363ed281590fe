"""Reading the batch records the monitors share: which rows count, grouped how."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

ALL = "all"  # the pooled group beside each environment: a tiny batch has too few rows per environment
# Fewer rows than this on either side and a distribution is not compared: a PSI or a correlation
# over a handful of samples says more about the draw than about the policy.
MIN_ROWS = 8


def scored(rows: Iterable[dict]) -> list[dict]:
    """The rows whose reward says something about the model: an infrastructure error says nothing."""
    return [row for row in rows if row.get("status") != "infra_error"]


def groups(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """{environment: rows} plus ALL: every row. Environments sorted, ALL first."""
    rows = list(rows)
    out: dict[str, list[dict]] = {ALL: rows}
    by_env: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_env[str(row.get("env"))].append(row)
    out.update(sorted(by_env.items()))
    return out


def sources(row: dict) -> dict:
    """{feedback source: version} of a reward row (rewards.combine writes it as feedback_sources)."""
    return row.get("feedback_sources") or row.get("sources") or {}


def rewards(rows: Iterable[dict]) -> list[float]:
    return [float(row["reward"]) for row in rows if row.get("reward") is not None]


def component_values(rows: Iterable[dict]) -> dict[str, list[float]]:
    """{component: its values}, a component that did not apply (None) left out."""
    out: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for name, value in (row.get("components") or {}).items():
            if value is not None:
                out[name].append(float(value))
    return dict(out)


def enough(*samples: list) -> bool:
    return all(len(sample) >= MIN_ROWS for sample in samples)


def fmt(value: float) -> str:
    return f"{value:.3g}"
