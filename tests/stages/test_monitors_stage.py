"""The monitors stage on a real git + DVC repository: the previous iteration's batch is read back at
the DVC experiment that saved it, the report and the numbers are written, and the gate holds a
candidate on a failing monitor that monitors.block_promotion names (and only then)."""

from __future__ import annotations

import copy
import subprocess

import pytest
import yaml

from closedloop import workspace as paths
from closedloop.io import read_json, write_json, write_jsonl
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.gitstate import git_identity_env
from closedloop.stage_files import info_path, metrics_path
from closedloop.stages.common import StageError, run_stage
from closedloop.workspace import Workspace

PREVIOUS = "iter-001-0123abcd"
ROWS = 40  # enough rows per environment for every distribution the monitors compare
# The batch files DVC records for an iteration (the rollouts are left out: an experiment that lacks a
# file compares as empty), and the train stage's git-tracked figures.
RECORDED = (paths.SAMPLES, paths.REWARDS, paths.EVALUATION, paths.CANARY_CHECK)


def params(iteration: int, **monitors) -> dict:
    from tests.tiny import TINY

    data = copy.deepcopy(TINY)
    data["loop"] = {"iteration": iteration}
    data["monitors"] = monitors
    return data


def summary(pass_at_1: float) -> dict:
    figures = {"pass@1": pass_at_1, "se": 0.0, "tasks": 20}
    return {"overall": figures, "envs": {"rules": figures}, "slices": {"rules/core": figures}}


def write_batch(ws: Workspace, iteration: int, timeouts: int, settings: dict) -> None:
    """A rules batch of ROWS samples, ``timeouts`` of them stopped by the time limit, and the rest of
    what the monitors read: the benchmark canary, the train stage's figures, an evaluation in which
    the candidate beats the champion everywhere (so only a monitor can hold it)."""
    (ws.root / "params.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    samples, rewards = [], []
    for index in range(ROWS):
        sample_id = f"rules/train/{index:03d}#0"
        samples.append({"sample_id": sample_id, "task_id": f"rules/train/{index:03d}", "env": "rules",
                        "completion": "x" * (10 + index % 7), "completion_tokens": 10 + index % 7})
        passed = index % 2 == 0
        status = "timeout" if index < timeouts else ("passed" if passed else "failed")
        reward = 0.0 if status == "timeout" else (1.0 if passed else 0.25)
        rewards.append({"sample_id": sample_id, "task_id": f"rules/train/{index:03d}", "env": "rules",
                        "components": {"format": 1.0, "result_match": float(passed and status != "timeout")},
                        "reward": reward, "passed": passed and status != "timeout", "status": status,
                        "feedback_sources": {"verifier:rules": "v1", "combiner": "c1"}})
    write_jsonl(ws.samples, samples)
    write_jsonl(ws.rewards, rewards)
    write_jsonl(ws.canary_check, [
        {"canary_id": f"rules/benchmark/{i}#{kind}", "env": "rules", "task_id": f"rules/benchmark/{i}", "kind": kind,
         "reward": 1.0 if kind == "reference" else 0.0, "passed": kind == "reference", "status": "passed",
         "verifier": "verifier:rules", "verifier_version": "v1", "components": {}}
        for i in range(4) for kind in ("reference", "blank")])
    write_json(ws.evaluation, {"champion": {"model_version": "champ", "summary": summary(0.2 + 0.01 * iteration)},
                               "candidate": {"model_version": f"cand{iteration}", "summary": summary(0.6)}})
    write_json(ws.path(metrics_path("train")), {"steps": 2, "final_loss": 1.5})
    write_json(ws.path(info_path("train")), {"mode": "rft"})


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """Iteration 1's batch saved as a DVC experiment, as the loop's version step saves it; then the
    workspace at iteration 2, whose params compare it with iteration 1."""
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace.at(root)
    write_batch(ws, 1, timeouts=0, settings=params(1))
    dvc = DvcWorkspace(root)
    dvc.init()
    env = git_identity_env(root)
    subprocess.run(["git", "add", "params.yaml", ".dvc", ".dvcignore"], cwd=root, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "workspace"], cwd=root, check=True, env=env)
    dvc.add(*RECORDED)
    dvc.exp_save(PREVIOUS)
    ws.candidate.mkdir(parents=True)  # a trained candidate (no closedloop_training.json says otherwise)
    write_jsonl(ws.path(paths.KNOWN_HACKS_CHECK), [])
    return ws


def monitors_of(ws: Workspace) -> dict[str, dict]:
    return {result["name"]: result for result in read_json(ws.monitors_report)["monitors"]}


def test_a_burst_of_timeouts_against_the_saved_iteration_fails_anomaly_rates(ws):
    write_batch(ws, 2, timeouts=16, settings=params(2, versions=[PREVIOUS]))  # 40% timeouts, 0% before
    run_stage("monitors", ws.root)
    report = read_json(ws.monitors_report)
    assert (report["iteration"], report["compared_with"]) == (2, [PREVIOUS])
    anomaly = monitors_of(ws)["anomaly_rates"]
    assert anomaly["verdict"] == "fail" and anomaly["value"] == pytest.approx(0.4)
    assert PREVIOUS in anomaly["message"]  # compared with the batch the experiment saved, not nothing
    # the rewards the timeouts zeroed move the reward distribution too; nothing is named to hold
    assert "anomaly_rates" in report["failing"] and report["holding"] == []
    assert set(monitors_of(ws)) == {"reward_shift", "verifier_shift", "proxy_gold_divergence", "length_inflation",
                                    "format_only_wins", "grpo_health", "anomaly_rates", "episode_gaming", "canary"}
    numbers = read_json(ws.metrics("monitors"))
    assert numbers["anomaly_rates"]["verdict_code"] == 2 and numbers["anomaly_rates"]["value"] == pytest.approx(0.4)
    assert numbers["grpo_health"]["verdict_code"] == -1  # an rft iteration: skipped, and said so
    assert monitors_of(ws)["grpo_health"]["message"]


def test_the_same_batch_again_trips_nothing_and_the_report_is_the_same_bytes(ws):
    write_batch(ws, 2, timeouts=0, settings=params(2, versions=[PREVIOUS]))
    run_stage("monitors", ws.root)
    first = (ws.monitors_report.read_bytes(), ws.path(metrics_path("monitors")).read_bytes())
    assert read_json(ws.monitors_report)["failing"] == []
    run_stage("monitors", ws.root)  # what `dvc repro` does: the same bytes, so `dvc status` stays clean
    assert (ws.monitors_report.read_bytes(), ws.path(metrics_path("monitors")).read_bytes()) == first


@pytest.mark.parametrize("blocking, promote", [
    (["anomaly_rates"], False),  # the failing monitor is named: the better candidate is held
    ([], True),  # the same failure, not named: said, and the figures decide
])
def test_block_promotion_makes_the_gate_hold_a_candidate_it_would_promote(ws, blocking, promote):
    from closedloop.reports.gate_report import gate_markdown

    write_batch(ws, 2, timeouts=16, settings=params(2, versions=[PREVIOUS], block_promotion=blocking))
    run_stage("monitors", ws.root)
    assert read_json(ws.monitors_report)["holding"] == blocking
    run_stage("gate", ws.root)
    gate = read_json(ws.gate)
    assert gate["promote"] is promote and gate["monitors_holding"] == blocking
    named = [reason for reason in gate["reasons"] if reason.startswith("monitor anomaly_rates (version ")]
    # the reason carries the monitor's own sentence: what rose, from what, against which iteration
    message = monitors_of(ws)["anomaly_rates"]["message"]
    assert len(named) == 1 and message in named[0] and "timeout" in message and PREVIOUS in message
    assert named[0].endswith("monitors.block_promotion holds the candidate" if blocking else "so it holds nothing")
    page = gate_markdown(gate, {"iteration": 2, "promoted": promote})
    assert "## Monitors" in page and "| anomaly_rates v" in page
    first_line = page.splitlines()[2]  # the decision sentence
    assert ("monitor anomaly_rates" in first_line) is (not promote)
    assert ("(holds promotion)" in page) is (not promote)


def test_monitors_off_skips_every_monitor_and_says_so(ws):
    write_batch(ws, 2, timeouts=16, settings=params(2, versions=[PREVIOUS], enabled=False))
    run_stage("monitors", ws.root)
    report = read_json(ws.monitors_report)
    assert report["enabled"] is False and report["failing"] == []
    assert {m["verdict"] for m in report["monitors"]} == {"skipped"}
    assert all("monitors.enabled is false" in m["message"] for m in report["monitors"])


def test_an_unknown_experiment_is_refused_naming_it(ws):
    write_batch(ws, 2, timeouts=0, settings=params(2, versions=["iter-001-ffffffff"]))
    with pytest.raises(StageError, match="monitors.versions: .*iter-001-ffffffff"):
        run_stage("monitors", ws.root)
    assert not ws.monitors_report.exists()  # nothing half-written


def test_a_gate_asked_to_block_on_monitors_refuses_without_their_report(ws):
    write_batch(ws, 2, timeouts=0, settings=params(2, block_promotion=["canary"]))
    with pytest.raises(StageError, match="monitors.json not found, but monitors.block_promotion names canary"):
        run_stage("gate", ws.root)
