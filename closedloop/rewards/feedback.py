"""Feedback sources: what produces reward components for a sample, behind one protocol.

Each environment's verifier is a source (rewards/verifier.py), human review is another
(rewards/human.py), and a user adds their own in params.yaml the way environments are added::

    reward:
      sources:
        judge: {entry: "mypkg.judge:LLMJudge", options: {url: "http://..."}, weights: {judge: 0.5}}

The reward stage takes every source from :func:`build_sources` and reads what each says through
:func:`feedback_of`; it never branches on a source's name (ARCHITECTURE rule 8). Plain records go in
and plain dicts come out (rule 10): tasks as ``{task_id: task record}``, samples as sample rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from closedloop.config import Params

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


class UserSource:
    """A user's source as params.yaml names it: its name is the key under ``reward.sources``, and its
    version a hash of its class's code, its options and its own ``version``, so an edited judge or
    prompt shows up in the rows even when its author forgets to bump ``version``."""

    def __init__(self, name: str, inner: Any, options: Mapping[str, Any],
                 weights: Mapping[str, float] | None = None) -> None:
        from closedloop.rewards.combine import source_version

        self.name = name
        self.inner = inner
        self.components = tuple(inner.components)
        self.weights = dict(weights or {})  # params.yaml's; a component missing here gets the default
        self.version = source_version(type(inner), {"options": dict(options),
                                                     "version": str(getattr(inner, "version", ""))})

    def score(self, tasks: Mapping[str, dict], samples: Sequence[dict]) -> Scores:
        return self.inner.score(tasks, samples)


def user_sources(params: Params) -> list[UserSource]:
    """Every source under ``reward.sources``, constructed with ``cls(**options)``, in name order."""
    sources = []
    for name, section in sorted(params.reward.sources.items()):
        where = f"params.yaml reward.sources.{name}"
        cls = _load(section.entry, f"{where}.entry")
        try:
            inner = cls(**section.options)
        except TypeError as error:  # an option its constructor does not take, or one it needs
            raise FeedbackSourceError(f"{where}.options: {section.entry} does not accept them: {error}") from None
        missing = [member for member in ("components", "score") if not hasattr(inner, member)]
        if missing:
            raise FeedbackSourceError(f"{where}.entry: {section.entry} lacks {missing} "
                                      "(see closedloop.rewards.feedback.FeedbackSource)")
        source = UserSource(name, inner, section.options, section.weights)
        unknown = sorted(set(section.weights) - set(source.components))
        if unknown:
            raise FeedbackSourceError(f"{where}.weights: unknown components {unknown}; "
                                      f"{name} has {list(source.components)}")
        sources.append(source)
    return sources


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


def _load(entry: str, where: str) -> type:
    from closedloop.entries import load_entry

    return load_entry(entry, where, ENTRY_POINT_GROUP, FeedbackSourceError)


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
    from closedloop.rewards.human import HumanLabels
    from closedloop.rewards.sources import component_versions, verifier_version
    from closedloop.rewards.verifier import VerifierSource

    by_env = {}
    for name in env_names:
        env = verifiers.env(name)
        by_env[name] = VerifierSource(name, verifiers, verifier_version(name, env, params),
                                      component_versions(env, params))
    human = HumanLabels.from_file(labels_path, weight=params.reward.human.weight)
    return Sources(verifiers=by_env, shared=[human, *user_sources(params)])
