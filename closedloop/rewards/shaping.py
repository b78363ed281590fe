"""Process supervision: the verifier's step signals shape the reward the trainer optimises.

The combined reward already credits some steps through its components (syntax, runs, format), but
only as far as each environment's weights say. Shaping adds, for every environment alike, a term for
how far along the verifier's chain (parse → run → compare) a sample got, plus optional weights per
named step. So within a task's group of samples, one that parses and runs but fails a test scores
above one that does not parse, and GRPO's advantages push toward it even when nothing passed.
"""

from __future__ import annotations

from typing import Any, Mapping


def step_values(steps: Mapping[str, Any]) -> dict[str, float]:
    """Each judged step signal as a value in [0, 1], in the verifier's order.

    True/False are 1/0; a fraction in [0, 1] is itself; ``tests_passed`` becomes the fraction of
    ``tests_total``. Counts, strings and ``None`` (not judged) are left out.
    """
    values: dict[str, float] = {}
    for name, value in steps.items():
        if name == "tests_total" or value is None or isinstance(value, str):
            continue
        if name == "tests_passed" and "tests_total" in steps:
            total = steps.get("tests_total") or 0
            values[name] = float(value) / total if total else 0.0
        elif isinstance(value, bool):
            values[name] = float(value)
        elif isinstance(value, (int, float)) and 0.0 <= value <= 1.0:
            values[name] = float(value)
    return values


def progress(steps: Mapping[str, Any]) -> float:
    """The mean of the step values: 0 when nothing held (or nothing was judged), 1 when all did."""
    values = step_values(steps)
    return sum(values.values()) / len(values) if values else 0.0


def shaped_reward(reward: float, steps: Mapping[str, Any], shaping: Any, passed: bool | None = None) -> float:
    """``base + shaping.progress * progress(steps) + sum(shaping.steps[name] * value(name))``, where the
    base is ``reward`` (shaping.base combined) or 1/0 for ``passed`` (shaping.base passed).

    ``shaping`` is a :class:`closedloop.config.ShapingParams`. Only differences within a group matter
    to GRPO, so the shaped reward need not stay in [0, 1].
    """
    values = step_values(steps)
    if getattr(shaping, "base", "combined") == "passed":
        if passed is None:
            raise ValueError("shaping.base is passed but the sample's verdict was not given")
        total = float(bool(passed))
    else:
        total = float(reward)
    if shaping.progress:
        total += shaping.progress * (sum(values.values()) / len(values) if values else 0.0)
    for name, weight in shaping.steps.items():
        total += weight * values.get(name, 0.0)
    return total
