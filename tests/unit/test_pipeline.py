"""dvc.yaml is rendered from the one stage table, and that table is consistent with the flow."""

from pathlib import Path

import yaml

from closedloop.config import Params
from closedloop.pipeline import ITERATION_STAGES, STAGES, render, render_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_committed_dvc_yaml_is_the_rendering():
    assert (ROOT / "dvc.yaml").read_text() == render_yaml("closedloop")


def test_every_stage_runs_its_own_command_and_depends_on_its_code():
    stages = render("closedloop")["stages"]
    for spec in STAGES:
        entry = stages[spec.name]
        assert entry["cmd"] == f"closedloop stage {spec.name}"
        assert f"closedloop/stages/{spec.name}.py" in entry["deps"]
        assert (ROOT / "closedloop" / "stages" / f"{spec.name}.py").exists()
        for dep in entry["deps"]:
            if dep.startswith("closedloop/"):
                assert (ROOT / dep).exists(), f"stage {spec.name} depends on missing {dep}"


def test_params_keys_exist_in_the_schema():
    data = Params().model_dump()
    for spec in STAGES:
        for key in spec.params:
            node = data
            for part in key.split("."):
                assert part in node, f"stage {spec.name} lists params key {key} the schema lacks"
                node = node[part]


def test_every_input_is_produced_earlier_or_is_the_champion():
    produced = {"data/champion"}
    for spec in STAGES:
        for dep in spec.deps:
            assert dep in produced, f"{spec.name} reads {dep} before any stage writes it"
        produced.update(spec.outs)


def test_iteration_stages_in_dag_order():
    assert ITERATION_STAGES == ("generate", "sample", "reward", "grade", "validate", "train", "evaluate",
                                "gate", "promote")


def test_root_params_yaml_is_valid():
    from closedloop.config import load_params

    load_params(ROOT)
    assert yaml.safe_load((ROOT / "params.yaml").read_text())
