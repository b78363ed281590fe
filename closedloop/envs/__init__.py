"""Verifiable environments, found by name.

Built-in entries are "module:Class" strings so that looking one up imports only that environment's
module. A user's environment is named in params.yaml under ``envs.custom.<name>.entry``, either as
"package.module:Class" or as the name of an entry point in the ``closedloop.environments`` group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from closedloop.entries import load_entry

if TYPE_CHECKING:
    from closedloop.config import Params

ENVIRONMENTS: dict[str, str] = {
    "code": "closedloop.envs.code:CodeEnv",
    "data": "closedloop.envs.data:DataEnv",
    "script": "closedloop.envs.script:ScriptEnv",
    "extract": "closedloop.envs.extract:ExtractEnv",
    "rules": "closedloop.envs.rules:RulesEnv",
}
ENTRY_POINT_GROUP = "closedloop.environments"
REQUIRED_MEMBERS = ("name", "uses_sandbox", "components", "default_weights", "generate", "reference",
                    "verify_batch", "component_sources")


class EnvironmentError_(ValueError):
    """An environment cannot be found or does not have the interface; the message says where."""


def _load(entry: str, where: str) -> type:
    return load_entry(entry, where, ENTRY_POINT_GROUP, EnvironmentError_)


def environment_class(name: str, params: Params | None = None) -> type:
    if name in ENVIRONMENTS:
        return _load(ENVIRONMENTS[name], f"built-in environment {name!r}")
    custom = params.envs.custom if params is not None else {}
    if name in custom:
        cls = _load(custom[name].entry, f"params.yaml envs.custom.{name}.entry")
        missing = [member for member in REQUIRED_MEMBERS if not hasattr(cls, member)]
        if missing:
            raise EnvironmentError_(f"params.yaml envs.custom.{name}.entry: {custom[name].entry} lacks {missing} "
                                    "(see closedloop.envs.base.Environment)")
        return cls
    known = sorted(ENVIRONMENTS) + sorted(custom)
    raise EnvironmentError_(f"unknown environment {name!r}; known: {known}")


def get_env(name: str, params: Params) -> Any:
    """Construct environment ``name`` from its section of params.yaml, checking its reward weights."""
    cls = environment_class(name, params)
    section = params.envs.section(name)
    env = cls(section)
    if getattr(env, "name", None) != name and name in ENVIRONMENTS:
        raise EnvironmentError_(f"environment class for {name!r} calls itself {env.name!r}")
    unknown = sorted(set(section.weights) - set(env.components))
    where = f"envs.custom.{name}" if name in params.envs.custom else f"envs.{name}"
    if unknown:
        raise EnvironmentError_(f"params.yaml {where}.weights: unknown components {unknown}; "
                                f"{name} has {list(env.components)}")
    return env


def reward_weights(env: Any, params: Params) -> dict[str, float]:
    """The weights that combine ``env``'s components: params.yaml's, else the environment's defaults."""
    return dict(params.envs.section(env.name).weights or env.default_weights)
