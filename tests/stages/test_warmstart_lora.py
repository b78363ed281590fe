"""warmstart.lora: a real model's warm start through LoRA adapters, merged; the built-in refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from closedloop.stages.common import StageError, run_stage
from closedloop.workspace import Workspace
from tests.conftest import TINY


def _workspace(root: Path, **sections) -> Path:
    params = {**TINY, **sections}
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


def test_a_real_model_warm_starts_through_merged_adapters(tmp_path):
    """Only the adapted projections change, the saved model has no adapter weights, and the micro-
    batch and checkpointing settings apply here too."""
    from safetensors.torch import load_file

    from closedloop.config import BuiltinModelParams
    from closedloop.models.builtin import create_builtin

    base = create_builtin(BuiltinModelParams(**{**TINY["model"]["builtin"], "max_position_embeddings": 512}),
                          ["# Return the sum of xs.\ndef f(xs):\n    return sum(xs)\n"] * 50, tmp_path / "base", seed=3)
    root = _workspace(tmp_path / "ws", model={"name_or_path": str(base)},
                      warmstart={**TINY["warmstart"], "lora": True},
                      train={**TINY["train"], "micro_batch_size": 3, "gradient_checkpointing": True,
                             "lora": {"enabled": False, "r": 4, "target_modules": ["q_proj", "v_proj"]}})
    run_stage("benchmark", root)
    metrics = run_stage("warmstart", root)
    assert metrics["lora"] is True and metrics["train_steps"] == TINY["warmstart"]["steps"]
    before = load_file(base / "model.safetensors")
    after = load_file(Workspace.at(root).warmstart_model / "model.safetensors")
    assert set(after) == set(before)  # merged: no adapter weights left
    changed = {name for name in before if not (before[name] == after[name]).all()}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed)


def test_lora_on_the_builtin_is_refused_before_anything_is_written(tmp_path):
    root = _workspace(tmp_path, warmstart={**TINY["warmstart"], "lora": True})
    with pytest.raises(StageError, match="warmstart.lora is true but model.name_or_path is the built-in"):
        run_stage("warmstart", root)
    ws = Workspace.at(root)
    assert not ws.references.exists() and not ws.warmstart_model.exists()
