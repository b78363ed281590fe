"""Names and versions of every feedback source: what lineage tags say produced a batch's rewards.

A version is a short hash of the source's code and config (rewards.combine.source_version), so a
changed validator, test harness or weight shows up as a new version in every sample it judged.
"""

from __future__ import annotations

from typing import Any

from closedloop.config import Params
from closedloop.rewards.combine import combine, source_version


def component_versions(env: Any, params: Params) -> dict[str, str]:
    """{component name: version} of one environment's reward components."""
    sandbox = _sandbox_code() if getattr(env, "uses_sandbox", False) else None
    return {name: source_version(code, {"config": config, "sandbox": sandbox})
            for name, (code, config) in env.component_sources().items()}


def feedback_sources(params: Params) -> dict[str, str]:
    """{source name: version} for every active environment's verifier and components, the combiner
    and the batch validator."""
    from closedloop.envs import get_env, reward_weights
    from closedloop.lineage.validation import suite_fingerprint

    sources: dict[str, str] = {}
    weights = {}
    for name in params.envs.active():
        env = get_env(name, params)
        # The env's params include its sandbox limits and isolation: they change what a verdict means.
        env_params = params.envs.section(name).model_dump(mode="json")
        sandbox = _sandbox_code() if env.uses_sandbox else None
        sources[f"verifier:{name}"] = source_version(type(env), {"env": env_params, "sandbox": sandbox})
        for component, version in component_versions(env, params).items():
            sources[f"component:{name}/{component}"] = version
        weights[name] = reward_weights(env, params)
    sources["combiner"] = source_version(combine, weights)
    sources["validator:batch"] = suite_fingerprint(params.sample.k)
    return sources


def _sandbox_code() -> str:
    """A hash of the sandbox's own code: its grading and jailing decide verdicts as much as the env's."""
    import hashlib
    from pathlib import Path

    import closedloop.sandbox as sandbox

    digest = hashlib.sha256()
    for path in sorted(Path(sandbox.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
