"""The training-mode registry: every value train.mode accepts is one mode, looked up by name, and the
train stage goes through the registry instead of branching on the name."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from closedloop.config import TrainParams, parse_params
from closedloop.training.modes import MODES, TrainingModeError, training_mode
from closedloop.training.modes.base import TrainingError, TrainingMode
from closedloop.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]


def test_the_registry_has_every_mode_params_yaml_accepts():
    accepted = typing.get_args(TrainParams.model_fields["mode"].annotation)
    assert sorted(MODES) == sorted(accepted)


@pytest.mark.parametrize("name", sorted(MODES))
def test_each_mode_loads_by_name_and_has_the_interface(name):
    mode = training_mode(name)
    assert isinstance(mode, TrainingMode) and mode.name == name
    inputs = mode.inputs(Workspace.at("/ws"), parse_params({"train": {"mode": name}}).train)
    assert inputs and all(str(path).startswith("/ws/") for path in inputs)


def test_an_unknown_mode_is_refused_naming_the_known_ones():
    known = r"train.mode: unknown training mode 'ppo'; known: \['grpo', 'rft', 'sft'\]"
    with pytest.raises(TrainingModeError, match=known):
        training_mode("ppo")


def test_the_checkpointed_inputs_follow_the_settings():
    ws = Workspace.at("/ws")
    train = parse_params({"train": {"include_references": False}}).train
    assert training_mode("rft").inputs(ws, train) == (ws.train_set,)
    assert training_mode("rft").inputs(ws, parse_params({}).train) == (ws.train_set, ws.references)
    assert training_mode("sft").inputs(ws, train) == (ws.references,)
    assert training_mode("grpo").inputs(ws, train) == (ws.tasks, ws.samples, ws.rewards, ws.rollouts)


def test_grpo_refuses_greedy_sampling():
    params = parse_params({"train": {"mode": "rft"}, "sample": {"temperature": 0.0}})
    training_mode("rft").check(params)  # the supervised modes train on any samples
    with pytest.raises(TrainingError, match="train.mode is grpo but sample.temperature is 0"):
        training_mode("grpo").check(params)


def test_the_train_stage_never_names_a_mode():
    """Seams, not switches: a new mode is a new module and a registry line, not a branch in the stage."""
    tree = ast.parse((ROOT / "closedloop/stages/train.py").read_text())
    names = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in MODES]
    assert names == []
