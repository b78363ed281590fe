"""Verifiable environments, found by name.

Entries are "module:Class" strings so that looking one up imports only that environment's module.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from closedloop.config import Params

ENVIRONMENTS: dict[str, str] = {"code": "closedloop.envs.code:CodeEnv"}


def environment_class(name: str) -> type:
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}")
    module_name, _, class_name = ENVIRONMENTS[name].partition(":")
    return getattr(import_module(module_name), class_name)


def get_env(name: str, params: Params) -> Any:
    """Construct environment ``name`` from its section ``params.envs.<name>``."""
    cls = environment_class(name)
    section = getattr(params.envs, name, None)
    if section is None:
        raise ValueError(f"environment {name!r} has no settings: params.yaml needs a section envs.{name}")
    return cls(section)
