"""benchmarks/budget_sweep.py's settings: each is a valid params file once laid over the repo's params.yaml,
so a misspelt key fails here, not an hour into a sweep on a lent machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from budget_sweep import SETTINGS, params_for  # noqa: E402

from closedloop.config import parse_params  # noqa: E402


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_setting_is_a_valid_params_file(name):
    params = parse_params(params_for(SETTINGS[name], {}))
    assert params.train.replay.last == 0  # what the harness cannot replay without DVC, for every setting alike


def test_the_rules_probe_changes_only_the_width_between_its_two_arms():
    narrow, wide = (parse_params(params_for(SETTINGS[name], {})) for name in ("rules_only", "rules_only_w384"))
    assert narrow.envs.active() == wide.envs.active() == ["rules"]
    assert (wide.model.builtin.hidden_size, wide.model.builtin.intermediate_size) == (384, 1152)
    # the same head width (48) as the default's 192 / 4
    assert wide.model.builtin.hidden_size // wide.model.builtin.num_heads == \
        narrow.model.builtin.hidden_size // narrow.model.builtin.num_heads
    assert narrow.model_dump(exclude={"model"}) == wide.model_dump(exclude={"model"})
