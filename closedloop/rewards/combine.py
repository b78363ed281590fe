"""Combine separate reward components into the scalar reward the grader and trainer use."""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any, Mapping


def combine(components: Mapping[str, float | None], weights: Mapping[str, float]) -> float:
    """Weighted mean over the components that apply to this sample.

    ``None`` means "not applicable" (e.g. no tests for a task), which drops the component from both
    numerator and denominator instead of counting it as zero. No applicable weighted component → 0.
    """
    total = weight_sum = 0.0
    for name, weight in weights.items():
        value = components.get(name)
        if weight <= 0 or value is None:
            continue
        total += weight * float(value)
        weight_sum += weight
    return total / weight_sum if weight_sum else 0.0


def source_version(obj: Any, config: Any) -> str:
    """A short hash of a feedback source's code and config: its version in lineage tags."""
    try:
        code = inspect.getsource(obj)
    except (OSError, TypeError):
        code = repr(obj)
    payload = code + "\n" + json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
