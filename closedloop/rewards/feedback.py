"""Feedback sources: what produces reward components for a sample, behind one protocol.

Each environment's verifier is a source (rewards/verifier.py), human review is another
(rewards/human.py), and a user adds their own in params.yaml the way environments are added::

    reward:
      sources:
        judge: {entry: "mypkg.judge:LLMJudge", options: {url: "http://..."}, weights: {judge: 0.5}}

The reward stage takes every source from :func:`closedloop.rewards.composition.build_sources` and reads what each says through
:func:`feedback_of`; it never branches on a source's name (ARCHITECTURE rule 8). Plain records go in
and plain dicts come out (rule 10): tasks as ``{task_id: task record}``, samples as sample rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

ENTRY_POINT_GROUP = "closedloop.feedback_sources"

Scores = dict[str, dict[str, "float | None"]]  # sample_id -> component -> value in [0, 1] (None: not applicable)


@runtime_checkable
class FeedbackSource(Protocol):
    """A named, versioned producer of reward components.

    ``score`` returns, for each sample it has something to say about, a value in [0, 1] per component
    (``None``: not applicable to this sample, dropped from the weighted mean rather than counted as 0).
    Samples it leaves out get none of its components. A source may also define
    ``feedback(tasks, samples) -> Feedback`` to add fields to the reward rows (the verifier's status
    and step signals, the reviewers of a human label); without it, :func:`feedback_of` builds one.
    """

    name: str
    components: tuple[str, ...]
    version: str

    def score(self, tasks: Mapping[str, dict], samples: Sequence[dict]) -> Scores:
        ...


@dataclass
class Feedback:
    """What one source said about a batch, in the shape the reward rows are assembled from."""

    components: Scores  # sample_id -> the components it gives that sample
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)  # sample_id -> extra reward-row fields
    named: dict[str, dict[str, str]] = field(default_factory=dict)  # sample_id -> {source key: version}
    figures: dict[str, Any] = field(default_factory=dict)  # numbers for metrics/reward.json
    sources: dict[str, str] = field(default_factory=dict)  # {source key: version}, applied or not


class FeedbackSourceError(ValueError):
    """A source cannot be loaded, or returned something that is not a score; the message names it."""


def feedback_of(source: Any, tasks: Mapping[str, dict], samples: Sequence[dict]) -> Feedback:
    """A source's feedback on ``samples``: its own ``feedback()`` when it has one, else its checked
    ``score()``, where a row names it as ``source:<name>`` when at least one component applied."""
    rich = getattr(source, "feedback", None)
    if callable(rich):
        return rich(tasks, samples)
    scores = source.score(tasks, samples)
    checked = check_scores(source, scores, {s["sample_id"] for s in samples})
    key = f"source:{source.name}"
    return Feedback(components=checked, named={sid: {key: source.version} for sid in checked},
                    sources={key: source.version})


def check_scores(source: Any, scores: Any, sample_ids: set[str]) -> Scores:
    """``scores`` as the protocol says, with the components that did not apply (None) left out of each
    sample; an unknown sample, an undeclared component or a value outside [0, 1] is an error naming
    the source, the sample and the value."""
    where = f"feedback source {source.name!r}"
    if not isinstance(scores, Mapping):
        raise FeedbackSourceError(f"{where}: score() must return {{sample_id: {{component: value}}}}, "
                                  f"got {type(scores).__name__}")
    declared = set(source.components)
    out: Scores = {}
    for sample_id, values in scores.items():
        if sample_id not in sample_ids:
            raise FeedbackSourceError(f"{where}: scored sample {sample_id!r}, which is not in the batch")
        if not isinstance(values, Mapping):
            raise FeedbackSourceError(f"{where}: sample {sample_id!r}: expected {{component: value}}, "
                                      f"got {type(values).__name__}")
        applied = {}
        for name, value in values.items():
            if name not in declared:
                raise FeedbackSourceError(f"{where}: sample {sample_id!r}: component {name!r} is not one of "
                                          f"its components {sorted(declared)}")
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0.0 <= value <= 1.0:
                raise FeedbackSourceError(f"{where}: sample {sample_id!r}: component {name!r} is {value!r}; "
                                          "expected a number in [0, 1] or None")
            applied[name] = float(value)
        if applied:
            out[sample_id] = applied
    return out
