"""One declaration each: the sandbox's limits (closedloop/sandbox_limits.py) and the monitors
(closedloop/monitor_catalog.py), read by config and by the code that enforces or runs them."""

import dataclasses

import pytest

from closedloop import monitor_catalog
from closedloop.config import MONITOR_NAMES, WARN_ONLY_MONITORS, ConfigError, SandboxParams, parse_params
from closedloop.monitors.registry import MONITORS
from closedloop.sandbox.records import Limits
from closedloop.sandbox_limits import LIMITS


def test_limits_and_the_sandbox_section_have_the_declared_limits():
    fields = {f.name: f for f in dataclasses.fields(Limits)}
    assert list(fields) == list(LIMITS)
    assert list(SandboxParams.model_fields) == [*LIMITS, "isolation"]
    for name, spec in LIMITS.items():
        assert fields[name].default == spec.default == SandboxParams.model_fields[name].default, name
        assert fields[name].type == spec.type.__name__ == SandboxParams.model_fields[name].annotation.__name__, name
    assert Limits.of(SandboxParams()) == Limits()


@pytest.mark.parametrize("name, spec", LIMITS.items())
def test_config_and_the_sandbox_accept_and_refuse_the_same_values(name, spec):
    if spec.minimum is None:
        pytest.skip(f"{name} has no bound")
    lowest = spec.minimum if not spec.exclusive else spec.minimum + (1 if spec.type is int else 0.001)
    below = spec.minimum - 1 if not spec.exclusive else spec.minimum
    assert getattr(Limits(**{name: lowest}), name) == lowest
    assert getattr(parse_params({"envs": {"code": {"sandbox": {name: lowest}}}}).envs.code.sandbox, name) == lowest
    with pytest.raises(ValueError, match=rf"Limits.{name} \({below}\) must be {spec.expected()}"):
        Limits(**{name: below})
    with pytest.raises(ConfigError, match=rf"envs.code.sandbox.{name}: Input should be greater than"):
        parse_params({"envs": {"code": {"sandbox": {name: below}}}})


def test_memory_bound_is_the_sandbox_s():
    # 32 MB runs a job (the interpreter needs ~20 MB), so params.yaml accepts what the sandbox does.
    assert parse_params({"envs": {"code": {"sandbox": {"memory_mb": 32}}}}).envs.code.sandbox.memory_mb == 32
    with pytest.raises(ConfigError, match=r"envs.code.sandbox.memory_mb: Input should be greater than or equal "
                                          r"to 32 \(got 31\)"):
        parse_params({"envs": {"code": {"sandbox": {"memory_mb": 31}}}})


def test_the_monitors_are_the_catalog_s():
    assert MONITOR_NAMES is monitor_catalog.MONITOR_NAMES and WARN_ONLY_MONITORS is monitor_catalog.WARN_ONLY_MONITORS
    assert tuple(monitor.name for monitor in MONITORS) == tuple(monitor_catalog.MONITORS)
    assert all(entry == f"closedloop.monitors.{name}" for name, entry in monitor_catalog.MONITORS.items())
