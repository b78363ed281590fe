"""benchmarks/trl_compare.py: TRL's GRPOTrainer from the loop's warm start, rewarded by the loop's own
feedback sources, stopped by its wall-clock budget and measured by the loop's own benchmark code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="trl is the benchmark extra: pip install -e '.[bench]'")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import trl_compare  # noqa: E402


def train_tasks(params, count: int = 12) -> list:
    from closedloop.envs import get_env
    from closedloop.envs.taskfile import tasks_for
    from closedloop.stages.common import env_mix

    tasks = []
    for name, n in env_mix(params, count).items():
        tasks += tasks_for(get_env(name, params), params.envs.section(name), n, seed=11, split="train")
    return tasks


def test_the_reward_function_scores_as_the_reward_stage_with_the_loop_s_stop_strings(warm_copy, tmp_path):
    from closedloop.config import load_params
    from closedloop.models.prompts import RAW_STOPS
    from closedloop.rewards.pools import EnvPools
    from closedloop.workspace import Workspace

    root = warm_copy(tmp_path / "ws")
    params = load_params(root)
    tasks = train_tasks(params)
    assert {task.env for task in tasks} == {"code", "data", "script", "extract", "rules"}
    with EnvPools(params) as verifiers:
        reward = trl_compare.closedloop_reward(params, verifiers, tasks, Workspace.at(root).human_labels, RAW_STOPS)
        ids = [task.task_id for task in tasks]
        references = reward([task.prompt for task in tasks], [task.reference for task in tasks], task_id=ids)
        # Past a stop string the loop's samplers cut the text: what follows is never scored.
        continued = reward([task.prompt for task in tasks],
                           [task.reference + "\ndef trailing(:\n  nonsense" for task in tasks], task_id=ids)
        wrong = reward([task.prompt for task in tasks], ["nothing useful here\n"] * len(tasks), task_id=ids)
        with pytest.raises(KeyError, match="not among the training tasks"):
            reward(["p"], ["x"], task_id=["code/train/none"])
    assert references == [1.0] * len(tasks), list(zip(ids, references))
    assert continued == references
    assert all(w < 1.0 for w in wrong), list(zip(ids, wrong))
    assert reward.__name__ == "closedloop_reward"


@pytest.mark.slow
def test_trl_trains_from_the_warm_start_within_its_budget_and_the_loop_s_benchmark_measures_it(warm_copy, tmp_path):
    # The tiny policy solves nothing, so its groups have no reward spread and TRL's steps move no weight
    # (frac_reward_zero_std 1.0): what this checks is the plumbing, budget and measurement; the reward
    # itself is checked above, the learning in docs/benchmarks.md.
    from closedloop.config import load_params
    from closedloop.workspace import Workspace

    root = warm_copy(tmp_path / "ws")
    params = load_params(root)
    lines: list[str] = []
    result = trl_compare.run_trl(root, train_tasks(params, 20), budget_s=6.0, points=2, out_dir=tmp_path / "trl",
                                 lr=1e-3, batch_size=2 * params.sample.k, echo=lines.append)

    curve = result["curve"]
    assert len(curve) == 2 and curve[0]["minutes"] < curve[1]["minutes"]
    assert 0 < curve[0]["steps"] <= curve[1]["steps"]
    assert result["train_seconds"] >= 6.0
    for point in curve:
        assert set(point["pass@1"]) == {"overall", "code", "data", "extract", "rules", "script"}
        assert all(0.0 <= value <= 1.0 for value in point["pass@1"].values())
        # A saved policy is a loop model directory: its sampling settings are the warm start's.
        saved = Path(point["model"])
        warm = Workspace.at(root).warmstart_model
        assert json.loads((saved / "closedloop_sampling.json").read_text()) == json.loads(
            (warm / "closedloop_sampling.json").read_text())
    assert result["final_model"] == curve[-1]["model"]
    # TRL's per-step figures, under TRL's names, with the loop's reward behind them.
    logged = {key for entry in result["logs"] for key in entry}
    assert {"frac_reward_zero_std", "rewards/closedloop_reward/mean", "entropy", "learning_rate"} <= logged, logged
    assert json.loads((tmp_path / "trl" / "logs.json").read_text()) == result["logs"]
    assert any("pass@1" in line for line in lines)


def test_a_batch_that_is_not_whole_groups_is_refused(warm_copy, tmp_path):
    from closedloop.config import load_params

    root = warm_copy(tmp_path / "ws")
    params = load_params(root)
    with pytest.raises(ValueError, match="multiple of sample.k"):
        trl_compare.run_trl(root, train_tasks(params), budget_s=1.0, out_dir=tmp_path / "trl",
                            batch_size=params.sample.k + 1)
