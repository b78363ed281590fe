"""benchmarks/budget_sweep.py: whole loops from run_stage alone, on a machine without the orchestration
stack (what lets the sweep run on a lent GPU machine that has only torch and transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from closedloop.config import parse_params
from tests.tiny import TINY

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("prefect", "mlflow", "dvc", "great_expectations", "ray")


@pytest.mark.slow
def test_the_sweep_runs_each_setting_as_a_loop_without_prefect_dvc_mlflow_gx_or_ray(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    # An import of any of these fails in the sweep's processes, as on a machine that lacks them.
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in BLOCKED))
    out = tmp_path / "sweep.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "budget_sweep.py"), "--settings", "default,default_sft",
         "--iterations", "1", "--parallel", "2", "--threads", "1", "--final-samples", "1",
         "--extra", json.dumps(TINY), "--workdir", str(tmp_path / "loops"), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr + "".join(
        p.read_text()[-3000:] for p in (tmp_path / "loops").glob("*.log"))

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    active = parse_params(TINY).envs.active()  # the warm start's row has a figure for each
    for setting in ("default", "default_sft"):
        mine = {row.get("iteration", "final"): row for row in rows if row["setting"] == setting}
        assert set(mine) == {0, 1, "final"}, mine
        assert 0.0 <= mine[0]["pass@1"] <= 1.0 and mine[0]["seconds"]["warmstart"] > 0
        assert set(mine[0]["envs"]) == set(active) and all(0.0 <= v <= 1.0 for v in mine[0]["envs"].values())
        assert mine[1]["train_steps"] == TINY["train"]["steps"]
        assert {"generate", "sample", "reward", "train", "evaluate", "gate", "promote"} <= set(mine[1]["seconds"])
        assert mine["final"]["final_check"]["samples_per_task"] == 1
    trained = json.loads((tmp_path / "loops" / "default_sft" / "data/models/candidate/closedloop_training.json").read_text())
    assert trained["mode"] == "sft"  # the control trained on the references alone
    assert "| default_sft |" in done.stdout and "change (paired" in done.stdout
