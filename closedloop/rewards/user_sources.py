"""A user's own feedback sources, as params.yaml's ``reward.sources`` names them: loaded by entry,
constructed with their options, checked against the protocol (rewards/feedback.py), versioned."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from closedloop.entries import load_entry
from closedloop.rewards.combine import source_version
from closedloop.rewards.feedback import ENTRY_POINT_GROUP, FeedbackSourceError, Scores

if TYPE_CHECKING:
    from closedloop.config import Params


class UserSource:
    """A user's source as params.yaml names it: its name is the key under ``reward.sources``, and its
    version a hash of its class's code, its options and its own ``version``, so an edited judge or
    prompt shows up in the rows even when its author forgets to bump ``version``."""

    def __init__(self, name: str, inner: Any, options: Mapping[str, Any],
                 weights: Mapping[str, float] | None = None) -> None:
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


def _load(entry: str, where: str) -> type:
    return load_entry(entry, where, ENTRY_POINT_GROUP, FeedbackSourceError)
