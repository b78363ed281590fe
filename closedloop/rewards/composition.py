"""The set of feedback sources a batch is scored by: each environment's verifier, the human labels and
the user's sources, with the weights that combine them and the check that no two give one component."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from closedloop.rewards.feedback import FeedbackSourceError
from closedloop.rewards.human import HumanLabels
from closedloop.rewards.sources import component_versions, verifier_version
from closedloop.rewards.user_sources import user_sources
from closedloop.rewards.verifier import VerifierSource

if TYPE_CHECKING:
    from closedloop.config import Params


def source_weights(verifier_weights: Mapping[str, float], sources: Sequence[Any]) -> dict[str, float]:
    """The weights an environment's reward combines: its verifier's, and every other source's
    components (``human``, the user's), as each source's ``weights`` gives them (params.yaml).

    A human label or a user source left unweighted counts as much as the environment's heaviest
    verifier component: a person who read the sample knows at least as much as the strongest
    automatic signal, so a "wrong" or "reward hacking" score must be able to pull a verifier's full
    marks down to half; yet it stays a weighted mean, so one reviewer cannot override every check.
    """
    heaviest = max(verifier_weights.values(), default=1.0)
    weights = dict(verifier_weights)
    for source in sources:
        configured = getattr(source, "weights", {})
        for component in source.components:
            weights[component] = configured.get(component, heaviest)
    return weights


def check_disjoint(sources: Sequence[Any]) -> None:
    """Two sources giving a component of the same name would overwrite each other in the rows."""
    owner: dict[str, str] = {}
    for source in sources:
        for component in source.components:
            if component in owner and owner[component] != source.name:
                raise FeedbackSourceError(f"feedback sources {owner[component]!r} and {source.name!r} both give "
                                          f"component {component!r}; rename one (reward.sources)")
            owner[component] = source.name


@dataclass
class Sources:
    """What the reward stage composes: each environment's verifier, and the sources that score every
    environment's samples (the human labels, then the user's), in the order rows are assembled."""

    verifiers: dict[str, Any]  # env name -> its verifier source
    shared: list[Any]

    def all(self) -> list[Any]:
        return [*self.verifiers.values(), *self.shared]


def build_sources(params: Params, verifiers: Any, env_names: Sequence[str], labels_path: Any) -> Sources:
    """The factory: a verifier source per environment in ``env_names`` (over ``verifiers``, an
    EnvPools), the human labels of ``labels_path``, every source under ``reward.sources``."""
    by_env = {}
    for name in env_names:
        env = verifiers.env(name)
        by_env[name] = VerifierSource(name, verifiers, verifier_version(name, env, params),
                                      component_versions(env, params))
    human = HumanLabels.from_file(labels_path, weight=params.reward.human.weight)
    return Sources(verifiers=by_env, shared=[human, *user_sources(params)])
