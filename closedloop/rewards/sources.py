"""Names and versions of every feedback source: what lineage tags say produced a batch's rewards.

A version is a short hash of the source's code and config (rewards.combine.source_version), so a
changed validator, test harness or weight shows up as a new version in every sample it judged.
"""

from __future__ import annotations

from typing import Any

import closedloop.sandbox as sandbox
from closedloop.batch_suite import suite_fingerprint
from closedloop.config import Params
from closedloop.envs import get_env, reward_weights
from closedloop.rewards.combine import combine, source_version
from closedloop.rewards.user_sources import user_sources


def component_versions(env: Any, params: Params) -> dict[str, str]:
    """{component name: version} of one environment's reward components."""
    sandbox = _sandbox_code() if getattr(env, "uses_sandbox", False) else None
    return {name: source_version(code, {"config": config, "sandbox": sandbox})
            for name, (code, config) in env.component_sources().items()}


def verifier_version(name: str, env: Any, params: Params) -> str:
    """The version of environment ``name``'s verifier: its class's code, its section of params.yaml
    (which holds its sandbox limits and isolation: they change what a verdict means), the sandbox's
    code, and its components' versions: a scoring function outside the class (a module-level helper
    a component names) changes verdicts as much as the class does."""
    env_params = params.envs.section(name).model_dump(mode="json")
    sandbox = _sandbox_code() if getattr(env, "uses_sandbox", False) else None
    return source_version(type(env), {"env": env_params, "sandbox": sandbox,
                                      "components": component_versions(env, params)})


def feedback_sources(params: Params) -> dict[str, str]:
    """{source name: version} for every active environment's verifier and components, the combiner,
    every user source (``source:<name>``) and the batch validator.

    The human labels' version is the hash of the labels file, which only the reward stage reads: it
    is in each row a label applied to, and in data/batch/reward_sources.json."""

    sources: dict[str, str] = {}
    weights = {}
    for name in params.envs.active():
        env = get_env(name, params)
        sources[f"verifier:{name}"] = verifier_version(name, env, params)
        for component, version in component_versions(env, params).items():
            sources[f"component:{name}/{component}"] = version
        weights[name] = reward_weights(env, params)
    users = user_sources(params)
    sources["combiner"] = source_version(combine, _combiner_config(weights, params))
    for source in users:
        sources[f"source:{source.name}"] = source.version
    sources["validator:batch"] = suite_fingerprint(params.sample.k, params.sample.rounds)
    return sources


def _combiner_config(weights: dict, params: Params) -> Any:
    """What decides how components combine. The human weight and user sources' weights enter only when
    params.yaml sets them: at their defaults they follow from the verifier weights already hashed
    (rewards.feedback.source_weights), so the combiner of a batch without them keeps its version."""
    extra = {}
    if params.reward.human.weight is not None:
        extra["human"] = params.reward.human.weight
    sources = {name: section.weights for name, section in sorted(params.reward.sources.items())}
    if sources:
        extra["sources"] = sources
    return {"weights": weights, **extra} if extra else weights


def _sandbox_code() -> str:
    """A hash of the sandbox's own code: its grading and jailing decide verdicts as much as the env's."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for path in sorted(Path(sandbox.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
