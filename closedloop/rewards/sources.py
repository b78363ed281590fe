"""Names and versions of every feedback source: what lineage tags say produced a batch's rewards."""

from __future__ import annotations

from closedloop.config import Params
from closedloop.rewards.combine import source_version


def feedback_sources(params: Params) -> dict[str, str]:
    """{source name: version}, the version hashing the source's code and config."""
    from closedloop.envs import environment_class
    from closedloop.lineage.validation import suite_fingerprint

    sandbox = {"timeout_s": params.reward.timeout_s, "memory_mb": params.reward.memory_mb}
    sources = {}
    for name in ("code",):
        env_params = getattr(params.envs, name).model_dump(mode="json")
        sources[f"verifier:{name}"] = source_version(environment_class(name), {"env": env_params, "sandbox": sandbox})
    from closedloop.rewards.combine import combine

    sources["combiner"] = source_version(combine, params.reward.weights)
    sources["validator:batch"] = suite_fingerprint(params.sample.k)
    return sources
