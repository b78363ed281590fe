"""format_only_wins: surface components up while the task components stay flat (open-r1 issue 255).

Each built-in environment's components are split explicitly into surface ones (the answer parses,
has the right shape, runs) and task ones (what the task asked: tests passed, values, files,
fields, decision); a component in neither (data's schema, the human score) is left out. A user's
environment is split by name: format / syntax / parse / json / runs are surface, the rest task.
Per environment, against the previous iteration: the value is the rise of the surface components'
mean when it is beyond noise (stats.SIGNIFICANCE_Z standard errors) and the task components' mean
rose by at most FLAT, else 0; the largest over environments.
"""

from __future__ import annotations

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, judged, skipped
from closedloop.monitors.rows import component_values, enough, groups, scored
from closedloop.monitors.stats import SIGNIFICANCE_Z, mean, mean_rise_z

NAME = "format_only_wins"
VERSION = "1"
DEFAULT = Threshold(warn=0.05, fail=0.15)
FLAT = 0.01

# (surface components, task components) of each built-in environment (closedloop/envs/*.py COMPONENTS)
SPLITS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "code": (("syntax", "runs"), ("tests_passed",)),
    "data": (("syntax", "runs"), ("values",)),
    "script": (("syntax", "runs"), ("files",)),
    "extract": (("format", "schema"), ("fields",)),
    "rules": (("format",), ("steps", "decision")),
}
SURFACE_WORDS = ("format", "syntax", "parse", "json", "runs")
NEITHER = ("human",)


def split(env: str, names: set[str]) -> tuple[list[str], list[str]]:
    if env in SPLITS:
        surface, task = SPLITS[env]
        return [n for n in surface if n in names], [n for n in task if n in names]
    kept = sorted(n for n in names if n not in NEITHER)
    surface = [n for n in kept if any(word in n for word in SURFACE_WORDS)]
    return surface, [n for n in kept if n not in surface]


def _per_row(rows: list[dict], names: list[str]) -> list[float]:
    """Each row's mean over ``names`` (the components that applied to it); rows with none left out."""
    out = []
    for row in rows:
        values = [float(v) for n in names if (v := (row.get("components") or {}).get(n)) is not None]
        if values:
            out.append(sum(values) / len(values))
    return out


def check(current: IterationData, history: list[IterationData], threshold: Threshold) -> MonitorResult:
    if not history:
        return skipped(NAME, VERSION, threshold, "no previous iteration to compare the components with")
    previous = history[-1]
    now_groups, before_groups = groups(scored(current.rewards)), groups(scored(previous.rewards))
    figures: dict[str, float] = {}
    worst: tuple[float, str] | None = None
    for env, rows in now_groups.items():
        if env == "all" or env not in before_groups:
            continue
        surface, task = split(env, set(component_values(rows)))
        if not surface or not task:
            continue
        old = before_groups[env]
        s_now, s_old, t_now, t_old = _per_row(rows, surface), _per_row(old, surface), _per_row(rows, task), _per_row(old, task)
        if not enough(s_now, s_old, t_now, t_old):
            continue
        surface_delta, task_delta = mean(s_now) - mean(s_old), mean(t_now) - mean(t_old)
        beyond_noise = mean_rise_z(s_now, s_old) > SIGNIFICANCE_Z
        value = surface_delta if beyond_noise and task_delta <= FLAT else 0.0
        figures.update({f"{env}.surface_delta": round(surface_delta, 6), f"{env}.task_delta": round(task_delta, 6),
                        f"{env}.format_only_gain": round(value, 6)})
        if worst is None or value > worst[0]:
            worst = (value, env)
    if worst is None:
        return skipped(NAME, VERSION, threshold, f"no environment has surface and task components on 8 or more "
                       f"rows in both this batch and {previous.label}")
    value, env = worst
    if value <= 0:
        return judged(NAME, VERSION, 0.0, threshold, figures,
                      f"no surface-only gain beyond noise against {previous.label}")
    surface, task = split(env, set(component_values(now_groups[env])))
    return judged(NAME, VERSION, value, threshold, figures,
                  f"{env}: {'/'.join(surface)} {figures[f'{env}.surface_delta']:+.3g} while "
                  f"{'/'.join(task)} {figures[f'{env}.task_delta']:+.3g} against {previous.label}")
