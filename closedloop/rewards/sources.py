"""Names and versions of every feedback source: what lineage tags say produced a batch's rewards."""

from __future__ import annotations

from closedloop.config import Params
from closedloop.rewards.combine import source_version


def feedback_sources(params: Params) -> dict[str, str]:
    """{source name: version}, the version hashing the source's code and config."""
    from closedloop.envs import environment_class
    from closedloop.lineage.validation import suite_fingerprint

    sources = {}
    for name in ("code",):
        # The env's params include its sandbox limits and isolation: they change what a verdict means.
        env_params = getattr(params.envs, name).model_dump(mode="json")
        sources[f"verifier:{name}"] = source_version(environment_class(name), {"env": env_params, "sandbox": _sandbox_code()})
    from closedloop.rewards.combine import combine

    sources["combiner"] = source_version(combine, params.reward.weights)
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
