"""Human review as a feedback source: the labels in data/labels/human.jsonl give the ``human`` component.

A label applies to a sample when it is the same completion (``completion_sha256``) of the same
sample (``sample_id``) or of the same task (``task_id``): the same completion seen again in a later
batch gets the score a person gave it. The completion hash is required in both cases because a
sample id is ``<task_id>#<index>``, which a later batch reuses for a different completion whenever
it draws the same task again; the id alone would carry a score to text nobody read.
The component's value is the mean score of the labels that apply; ``None`` when none does.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from closedloop.io import json_objects
from closedloop.review.agreement import agreement
from closedloop.rewards.feedback import Feedback, Scores

LABELS = ("correct", "wrong", "reward_hacking", "formatting", "other")
_TEXT_FIELDS = ("answer_id", "sample_id", "task_id", "completion_sha256", "reviewer")


class LabelsError(ValueError):
    """A labels file has a row the human source cannot use; the message names file, line and field."""


def completion_sha256(completion: str) -> str:
    return hashlib.sha256(completion.encode("utf-8")).hexdigest()


def read_labels(path: Path) -> list[dict[str, Any]]:
    """The labels of ``path`` (none when it does not exist yet), each row checked; a repeated
    ``answer_id`` counts once (the first), so an answer merged twice does not weigh double."""
    path = Path(path)
    if not path.exists():
        return []
    labels, seen = [], set()
    for where, row in json_objects(path.read_text(encoding="utf-8").splitlines(), path, LabelsError):
        for key in _TEXT_FIELDS:
            if not isinstance(row.get(key), str) or not row[key]:
                raise LabelsError(f"{where}: field {key!r} must be a non-empty string, got {row.get(key)!r}")
        score = row.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) \
                or not 0.0 <= score <= 1.0:
            raise LabelsError(f"{where}: field 'score' must be a number in [0, 1], got {score!r}")
        if row.get("label") not in LABELS:
            raise LabelsError(f"{where}: field 'label' must be one of {list(LABELS)}, got {row.get('label')!r}")
        if row["answer_id"] not in seen:
            seen.add(row["answer_id"])
            labels.append(row)
    return labels


def labels_version(path: Path) -> str:
    """A short hash of the labels file's content: the human source's version (empty file when absent)."""
    data = Path(path).read_bytes() if Path(path).exists() else b""
    return hashlib.sha256(data).hexdigest()[:12]


class HumanLabels:
    """The ``human`` component from review labels (see the module docstring for when one applies)."""

    name = "human"
    components = ("human",)

    def __init__(self, labels: Sequence[Mapping[str, Any]], version: str, weight: float | None = None) -> None:
        self.labels = list(labels)
        self.version = version
        self.weights = {} if weight is None else {"human": weight}  # empty: rewards.feedback's default
        self._by_completion: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for label in self.labels:
            self._by_completion[label["completion_sha256"]].append(label)

    @classmethod
    def from_file(cls, path: Path, weight: float | None = None) -> "HumanLabels":
        return cls(read_labels(path), labels_version(path), weight)

    def matching(self, sample: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The labels that apply to ``sample``, in file order."""
        candidates = self._by_completion.get(completion_sha256(sample["completion"]), [])
        return [label for label in candidates
                if label["sample_id"] == sample["sample_id"] or label["task_id"] == sample["task_id"]]

    def score(self, tasks: Mapping[str, dict], samples: Sequence[dict]) -> Scores:
        return {sample["sample_id"]: {"human": _mean_score(self.matching(sample))} for sample in samples}

    def feedback(self, tasks: Mapping[str, dict], samples: Sequence[dict]) -> Feedback:
        """Only samples a label applies to get the component, the ``human`` row field (score, who said
        it, which answers) and the labels' version among their sources: a batch nobody reviewed
        writes the rows it wrote before human review existed."""
        # Agreement over every label so far, and over the labels of the batch reviewed last alone (the
        # figure that moves with a verifier's change, iteration by iteration).
        batches = [label["iteration"] for label in self.labels if isinstance(label.get("iteration"), int)]
        last = [label for label in self.labels if batches and label.get("iteration") == max(batches)]
        figures = {"human": {"labels": len(self.labels), "applied": 0, "last_batch": max(batches, default=-1)},
                   "agreement": agreement_by_env(self.labels), "agreement_last_batch": agreement_by_env(last)}
        result = Feedback(components={}, figures=figures, sources={self.name: self.version})
        for sample in samples:
            found = self.matching(sample)
            if not found:
                continue
            sample_id = sample["sample_id"]
            score = _mean_score(found)
            result.components[sample_id] = {"human": score}
            result.fields[sample_id] = {"human": {
                "score": score, "reviewers": sorted({label["reviewer"] for label in found}),
                "answer_ids": [label["answer_id"] for label in found],
                "labels": sorted({label["label"] for label in found})}}
            result.named[sample_id] = {self.name: self.version}
            result.figures["human"]["applied"] += 1
        return result


def _mean_score(labels: Sequence[Mapping[str, Any]]) -> float | None:
    return round(sum(float(label["score"]) for label in labels) / len(labels), 6) if labels else None


def agreement_by_env(labels: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per environment, how the reviewers' verdicts agree with the verifier's on the samples they
    labelled (the ``verifier`` record each label carries: what the verifier said of that sample).

    A person says "pass" with the label ``correct`` or a score of at least 0.5. Labels of samples
    the verifier did not judge (a sandbox infrastructure error, or no verifier record) are left out.
    Numbers only, for metrics/reward.json: a kappa that is undefined (every verdict the same) is left
    out rather than written as null.
    """

    pairs: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for label in labels:
        verifier = label.get("verifier")
        if not isinstance(label.get("env"), str) or not isinstance(verifier, Mapping) \
                or not isinstance(verifier.get("passed"), bool) or verifier.get("status") == "infra_error":
            continue
        human_pass = label["label"] == "correct" or float(label["score"]) >= 0.5
        pairs[label["env"]].append((human_pass, verifier["passed"]))
    figures = {}
    for env, env_pairs in sorted(pairs.items()):
        found = agreement(env_pairs)
        figures[env] = {key: value for key, value in found.items() if value is not None}
    return figures
