"""A batch's reward rows from its feedback sources: what the reward stage writes to rewards.jsonl.

One function, so that the reward stage and `closedloop rescore` (a stored batch scored again with
today's verifiers) produce the same rows byte for byte from the same inputs: a difference between
them is then a difference of the sources, never of two code paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from closedloop.config import Params
from closedloop.envs import reward_weights
from closedloop.rewards.combine import reward_row
from closedloop.rewards.composition import build_sources, check_disjoint, source_weights
from closedloop.rewards.feedback import Feedback, feedback_of
from closedloop.rewards.sources import feedback_sources


def score_batch(params: Params, tasks: Mapping[str, dict], samples: Sequence[dict], verifiers: Any,
                labels_path: Path | str, combiner_version: str | None = None) -> tuple[list[dict], list[Feedback]]:
    """Every sample's reward row (rewards.jsonl order: the samples' order) and each source's feedback.

    ``tasks`` is ``{task_id: task record}`` holding every sample's task; ``verifiers`` an open
    closedloop.rewards.pools.EnvPools (the caller owns its pools); ``labels_path`` the human labels
    file as the batch should see it. ``combiner_version`` is ``feedback_sources(params)["combiner"]``,
    computed here when the caller has not already. Raises LabelsError or FeedbackSourceError (their
    messages name the file, line or source) before any row exists.
    """

    if combiner_version is None:
        combiner_version = feedback_sources(params)["combiner"]
    env_names = sorted({s["env"] for s in samples})
    sources = build_sources(params, verifiers, env_names, labels_path)
    weights = {}
    for env_name, verifier in sources.verifiers.items():
        check_disjoint([verifier, *sources.shared])
        weights[env_name] = source_weights(reward_weights(verifiers.env(env_name), params), sources.shared)
    feedbacks = [feedback_of(source, tasks, samples) for source in sources.all()]
    rows = [reward_row(sample, feedbacks, weights[sample["env"]], combiner_version) for sample in samples]
    return rows, feedbacks
