"""The sandbox pools verifiers run in: one per environment that runs code, started on first need.

Core, not a stage: the reward stage holds them in its own process (execution.backend local), and each
Ray reward actor holds its own (closedloop/rewards/verification.py), started in that actor: sandbox
workers never fork from a process that has loaded a model.
"""

from __future__ import annotations

from typing import Any

from closedloop.config import Params
from closedloop.envs import environment_class, get_env
from closedloop.sandbox import Limits, SandboxPool, SandboxUnavailable
from closedloop.sandbox.pool import DEFAULT_PRELOAD


class SandboxSetupError(RuntimeError):
    """An environment's sandbox cannot start as its params ask (bubblewrap required and missing...);
    the message names the environment and its key."""


def sandbox_pool(params: Params, env: str = "code", workers: int | None = None):
    """A sandbox pool with environment ``env``'s limits and isolation (its section's ``sandbox``) and
    the modules its jobs use preloaded in every worker; ``workers`` (default ``reward.workers``) processes."""

    settings = params.envs.section(env).sandbox
    preload = DEFAULT_PRELOAD + tuple(getattr(environment_class(env, params), "sandbox_preload", ()))
    return SandboxPool(workers=params.reward.workers if workers is None else workers, limits=Limits.of(settings), isolation=settings.isolation,
                       preload=preload)



class EnvPools:
    """Verifies completions of any environment, starting each environment's sandbox pool on first need.

    Each environment gets its own pool because limits, exec policy and preloaded modules differ;
    environments that need no sandbox get none.
    """

    def __init__(self, params: Params, sandbox_workers: int | None = None) -> None:
        self.params = params
        self.sandbox_workers = sandbox_workers  # None: reward.workers
        self._envs: dict[str, Any] = {}
        self._pools: dict[str, Any] = {}

    def env(self, name: str):
        if name not in self._envs:
            self._envs[name] = get_env(name, self.params)
        return self._envs[name]

    def pool(self, name: str):
        if not self.env(name).uses_sandbox:
            return None
        if name not in self._pools:
            try:
                self._pools[name] = sandbox_pool(self.params, name, self.sandbox_workers).__enter__()
            except SandboxUnavailable as error:
                raise SandboxSetupError(f"environment {name!r} (envs.{name}.sandbox): {error}") from None
        return self._pools[name]

    def prefetch(self, requests: Any) -> None:
        """Nothing to do ahead: verify_batch verifies on demand (ShardedVerifiers verifies ahead)."""

    def verify_batch(self, name: str, tasks: list, completions: list[str]) -> list:
        return self.env(name).verify_batch(tasks, completions, self.pool(name))

    def isolation(self) -> dict[str, str]:
        return {name: pool.isolation for name, pool in sorted(self._pools.items())}

    def close(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.__exit__(None, None, None)

    def __enter__(self) -> "EnvPools":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
