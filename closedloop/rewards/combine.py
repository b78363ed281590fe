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


def reward_row(sample: Mapping[str, Any], feedbacks: list[Any], weights: Mapping[str, float],
               combiner_version: str) -> dict[str, Any]:
    """One rewards.jsonl row: the sample's ids, every source's components and row fields, the
    combined reward and the sources (with versions) that produced it.

    ``feedbacks`` are rewards.feedback.Feedback of the sources, in order; two that set the same row
    field is a programming error, refused rather than letting the later one win silently.
    """
    sample_id = sample["sample_id"]
    row: dict[str, Any] = {"sample_id": sample_id, "task_id": sample["task_id"], "env": sample["env"]}
    components: dict[str, float | None] = {}
    named: dict[str, str] = {}
    for feedback in feedbacks:
        components.update(feedback.components.get(sample_id, {}))
        for key, value in feedback.fields.get(sample_id, {}).items():
            if key in row:
                raise ValueError(f"sample {sample_id!r}: two feedback sources set row field {key!r}")
            row[key] = value
        named.update(feedback.named.get(sample_id, {}))
    row["components"] = components
    row["reward"] = round(combine(components, weights), 6)
    row["feedback_sources"] = {**named, "combiner": combiner_version}
    return row
