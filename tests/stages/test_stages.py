"""Every stage on a temporary workspace with tiny params: outputs, determinism, refusals."""

from __future__ import annotations

import json
import shutil

import pytest

from closedloop.config import ConfigError, load_params
from closedloop.io import read_json, read_jsonl, replace_dir, write_jsonl
from closedloop.stage_files import stage_result
from closedloop.stages.common import StageError, run_stage
from closedloop.workspace import Workspace

STAGES_AFTER_WARM_START = ("generate", "sample", "reward", "grade", "validate", "train", "evaluate", "monitors",
                           "gate", "promote")


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> Workspace:
    """One workspace taken through the warm start and one iteration, stage by stage."""
    import yaml

    from tests.conftest import TINY

    root = tmp_path_factory.mktemp("stages")
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    ws = Workspace.at(root)
    run_stage("benchmark", root)
    run_stage("warmstart", root)
    replace_dir(ws.warmstart_model, ws.champion)  # what closing the loop does, minus DVC
    for name in STAGES_AFTER_WARM_START:
        run_stage(name, root)
    return ws


def test_every_stage_wrote_its_outputs_and_metrics(done):
    from closedloop.pipeline import STAGES

    for spec in STAGES:
        for out in spec.outs:
            assert (done.root / out).exists(), f"{spec.name} did not write {out}"
        assert read_json(done.root / "metrics/timing" / f"{spec.name}.json")["seconds"] >= 0


def test_benchmark_and_training_tasks_are_disjoint(done):
    bench = {t["task_id"] for t in read_jsonl(done.benchmark_tasks)}
    train = {t["task_id"] for t in read_jsonl(done.tasks)}
    prompts = {t["prompt"] for t in read_jsonl(done.benchmark_tasks)}
    assert bench and train and not bench & train
    assert not prompts & {t["prompt"] for t in read_jsonl(done.tasks)}


def test_samples_record_settings_model_version_and_tokens(done):
    params = load_params(done.root)
    samples = read_jsonl(done.samples)
    assert len(samples) == params.generate.n_tasks * params.sample.k
    from closedloop.models.loading import model_fingerprint

    version = model_fingerprint(done.champion)
    for sample in samples:
        assert sample["model_version"] == version
        assert (sample["temperature"], sample["top_p"], sample["max_new_tokens"], sample["k"]) == (
            params.sample.temperature, params.sample.top_p, params.sample.max_new_tokens, params.sample.k)
        assert sample["completion_tokens"] >= 0 and sample["prompt_tokens"] > 0
    timings = read_jsonl(done.sample_timings)
    assert [t["sample_id"] for t in timings] == [s["sample_id"] for s in samples]


def test_rollouts_carry_the_sampled_tokens_and_their_logprobs(done):
    """GRPO trains on exactly the tokens sampled: they decode to the completion (which the stop list
    may have cut), one log-probability per token, each a probability's log."""
    from closedloop.models.loading import load_policy

    _, tokenizer = load_policy(done.champion)
    samples = {s["sample_id"]: s for s in read_jsonl(done.samples)}
    rollouts = read_jsonl(done.rollouts)
    assert [r["sample_id"] for r in rollouts] == list(samples)
    for rollout in rollouts:
        sample = samples[rollout["sample_id"]]
        assert len(rollout["token_ids"]) == len(rollout["logprobs"]) == sample["completion_tokens"]
        assert all(lp <= 0 for lp in rollout["logprobs"])
        text = tokenizer.decode(rollout["token_ids"], skip_special_tokens=True)
        assert text.startswith(sample["completion"])


def test_rewards_keep_components_and_steps(done):
    from closedloop.config import BUILTIN_ENVS
    from closedloop.envs import get_env

    params = load_params(done.root)
    rows = read_jsonl(done.rewards)
    assert {row["env"] for row in rows} == set(BUILTIN_ENVS)  # the loop runs every environment
    for row in rows:
        env = get_env(row["env"], params)
        assert set(row["components"]) == set(env.components)
        if row["env"] == "code":
            assert {"parses", "runs", "tests_passed", "tests_total"} <= set(row["steps"])
        assert row["steps"] and 0.0 <= row["reward"] <= 1.0
        assert (row["failed_step"] is None) == row["passed"] or row["status"] == "infra_error"
        # every sample names its verifier, each component that applied and the combiner, with versions
        sources = row["feedback_sources"]
        assert f"verifier:{row['env']}" in sources and "combiner" in sources
        applied = {name for name, value in row["components"].items() if value is not None}
        assert {f"component:{row['env']}/{name}" for name in applied} <= set(sources)
        assert all(len(version) == 12 for version in sources.values())


def test_train_set_holds_the_references_of_exactly_the_unsolved_tasks(done):
    """Rejection sampling keeps nothing of a task no sample solved; its reference is what it teaches."""
    tasks = {t["task_id"]: t for t in read_jsonl(done.tasks)}
    solved = {row["task_id"] for row in read_jsonl(done.graded) if row["bucket"] == "positive"}
    unsolved = [r for r in read_jsonl(done.train_set) if r["source"] == "unsolved"]
    assert {r["task_id"] for r in unsolved} == set(tasks) - solved
    assert len(unsolved) == len(set(tasks) - solved) > 0
    for record in unsolved:
        task = tasks[record["task_id"]]
        assert (record["prompt"], record["completion"]) == (task["prompt"], task["reference"])
    assert read_json(done.metrics("grade"))["train_examples"]["unsolved"] == len(unsolved)


def test_reference_solutions_score_full_reward(done):
    """The reward stage on the references themselves: every one is a positive."""
    root = done.root
    scratch = root.parent / "refs"
    shutil.copytree(root, scratch)
    ws = Workspace.at(scratch)
    tasks = read_jsonl(ws.tasks)
    samples = [s for s in read_jsonl(ws.samples) if s["sample_index"] == 0]
    by_id = {t["task_id"]: t for t in tasks}
    from closedloop.io import write_jsonl

    write_jsonl(ws.samples, [{**s, "completion": by_id[s["task_id"]]["reference"]} for s in samples])
    run_stage("reward", scratch)
    rows = read_jsonl(ws.rewards)
    assert rows and all(row["passed"] and row["reward"] == 1.0 for row in rows), rows[:2]


@pytest.mark.parametrize("stage, output", [
    ("generate", "data/batch/tasks.jsonl"),
    ("sample", "data/batch/samples.jsonl"),
    ("reward", "data/batch/rewards.jsonl"),
    ("grade", "data/batch/graded.jsonl"),
])
def test_stage_outputs_are_deterministic(done, stage, output):
    before = (done.root / output).read_bytes()
    run_stage(stage, done.root)
    assert (done.root / output).read_bytes() == before


def test_gate_report_names_its_reasons(done):
    gate = read_json(done.gate)
    assert isinstance(gate["promote"], bool) and gate["reasons"]
    assert "overall pass@1" in gate["reasons"][0]
    promoted = stage_result(done.root, "promote")  # model_version is in metrics/info/promote.json
    from closedloop.models.loading import model_fingerprint

    expected = done.candidate if gate["promote"] else done.champion
    assert model_fingerprint(done.next_champion) == model_fingerprint(expected) == promoted["model_version"]


def test_corrupted_batch_fails_validation_and_training_refuses(done, tmp_path):
    scratch = tmp_path / "corrupt"
    shutil.copytree(done.root, scratch)
    ws = Workspace.at(scratch)
    rows = read_jsonl(ws.graded)
    rows[0]["reward"] = 1.5
    from closedloop.io import write_jsonl

    write_jsonl(ws.graded, rows)
    with pytest.raises(StageError) as error:
        run_stage("validate", scratch)
    message = str(error.value)
    assert "expect_column_values_to_be_between" in message and "reward" in message
    report = read_json(ws.validation_report)
    assert report["success"] is False
    candidate_before = sorted(p.name for p in ws.candidate.iterdir())
    shutil.rmtree(ws.candidate)
    with pytest.raises(StageError, match="failed validation"):
        run_stage("train", scratch)
    assert not ws.candidate.exists(), candidate_before


def test_unknown_task_in_samples_is_refused(done, tmp_path):
    scratch = tmp_path / "unknown"
    shutil.copytree(done.root, scratch)
    ws = Workspace.at(scratch)
    samples = read_jsonl(ws.samples)
    samples[0]["task_id"] = "code/train/nope"
    ws.samples.write_text("".join(json.dumps(s) + "\n" for s in samples))
    before = ws.rewards.read_bytes()
    with pytest.raises(StageError, match="code/train/nope"):
        run_stage("reward", scratch)
    assert ws.rewards.read_bytes() == before  # nothing half-written


def _copy_with(done, tmp_path, name: str, section: str, **values) -> Workspace:
    """A copy of the done workspace whose params.yaml has ``values`` set in ``section``."""
    import yaml

    scratch = tmp_path / name
    shutil.copytree(done.root, scratch)
    data = yaml.safe_load((scratch / "params.yaml").read_text())
    data.setdefault(section, {}).update(values)
    (scratch / "params.yaml").write_text(yaml.safe_dump(data))
    return Workspace.at(scratch)


def _with_params(done, tmp_path, name, **sample):
    return _copy_with(done, tmp_path, name, "sample", **sample)


def test_models_carry_the_sampling_settings_of_their_rollouts(done):
    from closedloop.models.prompts import RAW_STOPS
    from closedloop.models.settings import read_settings

    params = load_params(done.root)
    for model_dir in (done.warmstart_model, done.candidate, done.next_champion):
        saved = read_settings(model_dir)
        assert saved["temperature"] == params.sample.temperature
        # sample.stop is empty: raw prompts stop where one function or script ends
        assert params.sample.stop is None and saved["stop"] == list(RAW_STOPS) and saved["prompt_format"] == "raw"


def test_sampling_with_mismatched_settings_fails_naming_the_setting(done, tmp_path):
    ws = _with_params(done, tmp_path, "mismatch", temperature=0.5)
    before = ws.samples.read_bytes()
    with pytest.raises(StageError) as error:
        run_stage("sample", ws.root)
    assert "temperature: the model's rollouts used 1.0, requested 0.5" in str(error.value)
    assert ws.samples.read_bytes() == before  # nothing written
    with pytest.raises(StageError, match="temperature"):
        run_stage("evaluate", ws.root)


def test_mismatch_can_be_downgraded_to_a_warning(done, tmp_path, capsys):
    ws = _with_params(done, tmp_path, "warn", temperature=0.5, settings_mismatch="warn")
    metrics = run_stage("sample", ws.root)
    assert metrics["settings_mismatches"] and "temperature" in metrics["settings_mismatches"][0]
    assert "warning" in capsys.readouterr().err


def test_training_is_deterministic(done, tmp_path):
    """The same batch and params give the same candidate, byte for byte."""
    from closedloop.models.loading import model_fingerprint

    scratch = tmp_path / "again"
    shutil.copytree(done.root, scratch)
    run_stage("train", scratch)
    assert model_fingerprint(Workspace.at(scratch).candidate) == model_fingerprint(done.candidate)


def test_train_refuses_a_checkpoint_of_another_batch(done):
    """A checkpoint left by a killed train stage of another batch is refused, naming the batch."""
    import torch

    from closedloop.training.checkpoints import CHECKPOINT_FILE

    scratch = done.root.parent / "stale-checkpoint"
    shutil.copytree(done.root, scratch)
    ws = Workspace.at(scratch)
    directory = ws.candidate.with_name("candidate.checkpoint")
    directory.mkdir()
    torch.save({"identity": {"input train_set.jsonl": "another batch"}, "step": 1}, directory / CHECKPOINT_FILE)
    with pytest.raises(StageError, match=r"changed since it was written: .*input train_set.jsonl"):
        run_stage("train", scratch)
    shutil.rmtree(directory)
    run_stage("train", scratch)  # without it, the stage trains from the start
    assert not directory.exists()


def _mode_copy(done, tmp_path, name: str, **train) -> Workspace:
    return _copy_with(done, tmp_path, name, "train", **train)


def _training_record(ws: Workspace) -> dict:
    from closedloop.training.candidate_record import TRAINING_FILE

    return json.loads((ws.candidate / TRAINING_FILE).read_text())


def test_the_training_mode_is_recorded_with_the_model(done):
    record = _training_record(done)
    assert record["mode"] == "rft" == stage_result(done.root, "train")["mode"]
    assert record["params"]["steps"] == load_params(done.root).train.steps
    assert set(record["data"]) >= {"reference"}


def test_sft_mode_trains_on_the_references_alone(done, tmp_path):
    ws = _mode_copy(done, tmp_path, "sft", mode="sft")
    metrics = run_stage("train", ws.root)
    references = len(read_jsonl(ws.references))
    assert metrics["mode"] == "sft" and metrics["examples"] == {"reference": references}
    assert _training_record(ws)["mode"] == "sft"


def test_grpo_mode_trains_on_every_group_with_a_reward_spread(done, tmp_path):
    """The tiny policy fails everything; giving the first sample of half the tasks a reward makes
    those groups carry signal. The rest have no spread: skipped and counted."""
    from closedloop.io import write_jsonl
    from closedloop.models.loading import model_fingerprint

    ws = _mode_copy(done, tmp_path, "grpo", mode="grpo")
    task_ids = sorted({s["task_id"] for s in read_jsonl(ws.samples)})
    rewarded = set(task_ids[::2])
    samples = {s["sample_id"]: s for s in read_jsonl(ws.samples)}
    rows = read_jsonl(ws.rewards)
    for row in rows:
        sample = samples[row["sample_id"]]
        if sample["task_id"] in rewarded and sample["sample_index"] == 0:
            row["reward"] = 1.0
    write_jsonl(ws.rewards, rows)
    metrics = run_stage("train", ws.root)
    k = load_params(ws.root).sample.k
    assert metrics["mode"] == "grpo"
    assert metrics["groups"] == len(task_ids) and metrics["skipped_groups"] <= len(task_ids) - len(rewarded)
    assert metrics["examples"]["rollout"] >= len(rewarded) * k - len(rewarded)  # empty completions drop out
    assert metrics["steps"] > 0 and metrics["tokens_per_s"] > 0
    assert metrics["initial_log_ratio"] < 1e-3  # the rollouts' log-probabilities are the policy's
    assert metrics["model_version"] != metrics["parent_version"]
    assert _training_record(ws)["mode"] == "grpo"
    # What TRL and verl log: in the metrics (so in MLflow at step = iteration), per step in the record.
    assert metrics["frac_reward_zero_std"] == pytest.approx(metrics["skipped_groups"] / metrics["groups"], abs=1e-6)
    assert metrics["advantage_std"] > 0 and metrics["entropy_mean"] > 0 and metrics["kl_mean"] >= 0
    assert metrics["grad_norm_max"] >= metrics["grad_norm_mean"] > 0 and 0 <= metrics["truncated_share"] <= 1
    assert metrics["truncated_share"] == pytest.approx(
        sum(s["finish_reason"] == "length" for s in samples.values()) / len(samples), abs=1e-6)
    log = _training_record(ws)["steps_log"]
    assert len(log) == metrics["steps"] and {"loss", "lr", "grad_norm", "clip_low", "clip_high", "kl", "entropy"} <= set(log[0])
    assert "steps_log" not in metrics
    first = model_fingerprint(ws.candidate)
    run_stage("train", ws.root)
    assert model_fingerprint(ws.candidate) == first  # deterministic in this mode too


def test_grpo_refuses_greedy_rollouts(done, tmp_path):
    import yaml

    ws = _mode_copy(done, tmp_path, "grpo-greedy", mode="grpo")
    data = yaml.safe_load((ws.root / "params.yaml").read_text())
    data.setdefault("sample", {})["temperature"] = 0.0
    (ws.root / "params.yaml").write_text(yaml.safe_dump(data))
    before = ws.candidate.joinpath("model.safetensors").read_bytes()
    # Refused when params.yaml loads, naming both keys: before sampling and reward have run, not after.
    with pytest.raises(ConfigError, match="train.mode is grpo but sample.temperature is 0"):
        run_stage("train", ws.root)
    assert ws.candidate.joinpath("model.safetensors").read_bytes() == before  # nothing written


def test_replay_of_an_unknown_version_names_the_key(done, tmp_path):
    ws = _mode_copy(done, tmp_path, "replay-unknown", replay={"versions": ["iter-999-nothere"]})
    with pytest.raises(StageError, match=r"train.replay.versions: no DVC experiment named 'iter-999-nothere'"):
        run_stage("train", ws.root)


def test_lora_trains_adapters_on_the_target_modules_and_saves_them_merged(done, tmp_path):
    """With train.lora the candidate differs from the champion only in the adapted projections, and it
    is saved as a plain model (adapters merged), deterministic like full training."""
    from safetensors.torch import load_file

    from closedloop.models.loading import model_fingerprint

    ws = _mode_copy(done, tmp_path, "lora", lora={"enabled": True, "r": 4, "target_modules": ["q_proj", "v_proj"]})
    run_stage("train", ws.root)
    champion = load_file(ws.champion / "model.safetensors")
    candidate = load_file(ws.candidate / "model.safetensors")
    assert set(candidate) == set(champion)  # no adapter weights left: merged
    changed = {name for name in champion if not (champion[name] == candidate[name]).all()}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed)
    assert _training_record(ws)["params"]["lora"]["enabled"] is True
    first = model_fingerprint(ws.candidate)
    run_stage("train", ws.root)
    assert model_fingerprint(ws.candidate) == first


def test_lora_on_modules_the_model_lacks_names_the_key(done, tmp_path):
    ws = _mode_copy(done, tmp_path, "lora-bad", lora={"enabled": True, "target_modules": ["no_such_proj"]})
    with pytest.raises(StageError, match=r"train.lora.target_modules \['no_such_proj'\]"):
        run_stage("train", ws.root)



def test_a_regressed_group_is_measured_again_on_its_own_tasks_and_the_gate_says_so(done, tmp_path, monkeypatch):
    """gate.confirm_samples: the groups the first evaluation would hold the candidate for are evaluated
    again, both models, on their tasks alone; the gate decides them on those figures and says both."""
    from closedloop.stages import evaluate

    # The tiny models score 0 on every group, so none regresses by itself: the rule's choice is forced
    # (a slice and an environment of another env), the measuring and deciding are the stage's own.
    chosen_groups = ["env rules", "slice code/edge"]
    seen = []
    monkeypatch.setattr(evaluate, "regressed_groups", lambda champion, candidate, **rule: seen.append(rule) or chosen_groups)
    ws = _copy_with(done, tmp_path, "confirm", "gate", confirm_samples=3)
    run_stage("evaluate", ws.root)
    params = load_params(ws.root)
    assert seen == [{"slice_tolerance": params.gate.slice_tolerance, "noise_z": params.gate.noise_z}]
    evaluation = read_json(ws.evaluation)
    confirmation = evaluation["confirmation"]
    assert sorted(confirmation["groups"]) == sorted(chosen_groups) and confirmation["samples_per_task"] == 3
    benchmark = read_jsonl(ws.benchmark_tasks)
    on_them = [t for t in benchmark if t["env"] == "rules" or (t["env"], t["slice"]) == ("code", "edge")]
    assert confirmation["tasks"] == len(on_them) < len(benchmark)
    summary = evaluation["champion"]["summary"]
    for role in ("champion", "candidate"):
        assert confirmation["groups"]["env rules"][role]["tasks"] == summary["envs"]["rules"]["tasks"]
        assert confirmation["groups"]["slice code/edge"][role]["tasks"] == summary["slices"]["code/edge"]["tasks"]
    assert stage_result(ws.root, "evaluate")["confirmed_groups"] == 2
    assert confirmation["seed"] == params.stage_seed("evaluate/confirm") != params.stage_seed("evaluate")

    run_stage("gate", ws.root)
    gate = read_json(ws.gate)
    assert gate["confirmation"] == confirmation and gate["settings"]["confirm_samples"] == 3
    for name in chosen_groups:
        said = next(r for r in gate["reasons"] if r.startswith(name + " ") or r.startswith(name + ":"))
        assert "measured again at 3 samples per task after the first evaluation's" in said, said
    others = [r for r in gate["reasons"] if r.startswith(("env ", "slice ")) and not r.startswith(tuple(chosen_groups))]
    assert others and not any("measured again" in r for r in others)

    # confirm_samples 0: nothing measured again, whatever regressed
    off = _copy_with(done, tmp_path, "confirm-off", "gate", confirm_samples=0)
    run_stage("evaluate", off.root)
    assert "confirmation" not in read_json(off.evaluation)
    assert stage_result(off.root, "evaluate")["confirmed_groups"] == 0


def _grpo_rounds_copy(done, tmp_path, name: str, **grpo) -> Workspace:
    return _mode_copy(done, tmp_path, name, mode="grpo", checkpoint_every=2, grpo={"rounds": 2, **grpo})


def test_grpo_rounds_sample_the_later_parts_from_the_policy_being_trained(done, tmp_path):
    """train.grpo.rounds 2: the first half of the tasks trains on the sample stage's samples, the other half
    is sampled from the policy after round 1 and scored by the reward stage's sources; those samples are
    the stage's output, and the same inputs give the same bytes."""
    from closedloop.models.loading import model_fingerprint
    from closedloop.training.rounds import round_parts

    ws = _grpo_rounds_copy(done, tmp_path, "grpo-rounds")
    metrics = run_stage("train", ws.root)
    params = load_params(ws.root)
    tasks = [t["task_id"] for t in read_jsonl(ws.tasks)]
    first, second = round_parts(tasks, 2, params.stage_seed("train"))
    assert set(first).isdisjoint(second) and sorted(first + second) == sorted(tasks)
    rows = read_jsonl(ws.train_rounds)
    assert len(rows) == len(second) * params.sample.k
    assert {r["task_id"] for r in rows} == set(second) and {r["round"] for r in rows} == {2}
    assert all(r["token_ids"] and r["scored"]["sample_id"] == r["sample_id"] and 0.0 <= r["scored"]["reward"] <= 1.0
               for r in rows)
    # scored as the reward stage scores: the same row fields, sources and versions, and the same reward
    # for a completion the sample stage drew too
    stage_rows = read_jsonl(ws.rewards)
    assert {key for r in rows for key in r["scored"]} == {key for r in stage_rows for key in r}
    stage_row_of_env = {r["env"]: r for r in stage_rows}
    assert all(r["scored"]["feedback_sources"] == stage_row_of_env[r["env"]]["feedback_sources"] for r in rows)
    stage_reward = {(s["task_id"], s["completion"]): r["reward"] for s, r in zip(read_jsonl(ws.samples), stage_rows)}
    for row in rows:
        assert stage_reward.get((row["task_id"], row["completion"]), row["scored"]["reward"]) == row["scored"]["reward"]
    assert metrics["rounds"] == 2 and metrics["rounds_resumed"] == 0 and "round_2" in metrics["round_pass_rates"]
    assert metrics["groups"] == len(tasks)  # both rounds' groups
    log = _training_record(ws)["steps_log"]
    assert [r["step"] for r in log] == list(range(1, metrics["steps"] + 1))
    assert not (ws.candidate.with_name("candidate.checkpoint") / "rounds").exists()
    candidate, written = model_fingerprint(ws.candidate), ws.train_rounds.read_bytes()
    run_stage("train", ws.root)
    assert model_fingerprint(ws.candidate) == candidate and ws.train_rounds.read_bytes() == written


def test_grpo_rounds_killed_between_rounds_resume_to_the_uninterrupted_result(done, tmp_path):
    import os
    import subprocess
    import sys

    from closedloop.models.loading import model_fingerprint

    whole = _grpo_rounds_copy(done, tmp_path, "grpo-rounds-whole")
    run_stage("train", whole.root)
    ws = _grpo_rounds_copy(done, tmp_path, "grpo-rounds-killed")
    killed = subprocess.run([sys.executable, "-m", "closedloop.cli", "stage", "train", "--workspace", str(ws.root)],
                            env={**os.environ, "CLOSEDLOOP_FAULT": "train:round"}, start_new_session=True,
                            capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (ws.candidate.with_name("candidate.checkpoint") / "rounds" / "round-1").is_dir()
    metrics = run_stage("train", ws.root)
    assert metrics["rounds_resumed"] == 1
    assert model_fingerprint(ws.candidate) == model_fingerprint(whole.candidate)
    assert ws.train_rounds.read_bytes() == whole.train_rounds.read_bytes()
    assert _training_record(ws)["steps_log"] == _training_record(whole)["steps_log"]


# -- multi-round episodes (sample.rounds) ------------------------------------------------------------


@pytest.fixture(scope="module")
def episodes(done, tmp_path_factory) -> Workspace:
    """The done workspace's iteration again with sample.rounds 3, sample to evaluate."""
    ws = _copy_with(done, tmp_path_factory.mktemp("episodes"), "episodes", "sample", rounds=3)
    for name in ("sample", "reward", "grade", "validate", "train", "evaluate"):
        run_stage(name, ws.root)
    return ws


def test_an_episode_revises_a_failed_attempt_reading_the_visible_checks_feedback(episodes):
    from closedloop.envs import get_env
    from closedloop.envs.base import load_tasks
    from closedloop.envs.episodes import episode_checks, shown_feedback
    from closedloop.models.prompts import episode_prompt
    from closedloop.rewards.pools import EnvPools

    params = load_params(episodes.root)
    tasks = {task.task_id: task for task in load_tasks(episodes.tasks)}
    samples = read_jsonl(episodes.samples)
    assert len(samples) == len(tasks) * params.sample.k
    stops = {s["episode"]["stop"] for s in samples}
    assert stops <= {"passed", "rounds", "context"} and "rounds" in stops  # the tiny policy rarely passes
    with EnvPools(params) as pools:
        for sample in samples:
            episode, task = sample["episode"], tasks[sample["task_id"]]
            attempts = episode["attempts"]
            assert len(attempts) == episode["rounds"] == len(episode["feedback"]) == len(episode["visible_passed"])
            assert sample["completion"] == attempts[-1]  # the row is the final attempt's
            # stopped when the visible checks passed, else at 3 rounds (or a transcript too long)
            assert episode["visible_passed"][:-1] == [False] * (len(attempts) - 1)
            assert (episode["stop"] == "passed") == episode["visible_passed"][-1]
            assert episode["stop"] != "rounds" or len(attempts) == 3
            # the final attempt was sampled on the transcript of the earlier ones and what was shown of them
            assert episode["prompt"] == episode_prompt(task.prompt, list(zip(attempts[:-1], episode["feedback"][:-1])))
            env = get_env(task.env, params)
            visible = episode_checks(env, task).visible
            verdict = pools.verify_batch(task.env, [visible], [attempts[-1]])[0]
            assert episode["feedback"][-1] == shown_feedback(env, visible, verdict)
    assert stage_result(episodes.root, "sample")["episodes"]["stops"]["rounds"] > 0


def test_an_episode_is_rewarded_by_its_final_attempt_on_the_hidden_checks(episodes):
    from closedloop.envs import get_env
    from closedloop.envs.base import load_tasks
    from closedloop.envs.episodes import episode_checks
    from closedloop.rewards.pools import EnvPools

    params = load_params(episodes.root)
    tasks = {task.task_id: task for task in load_tasks(episodes.tasks)}
    rows = read_jsonl(episodes.rewards)
    samples = read_jsonl(episodes.samples)
    with EnvPools(params) as pools:
        for row, sample in zip(rows, samples):
            hidden = episode_checks(get_env(sample["env"], params), tasks[sample["task_id"]]).hidden
            verdicts = pools.verify_batch(sample["env"], [hidden] * sample["episode"]["rounds"],
                                          sample["episode"]["attempts"])
            assert row["episode"]["hidden_passed"] == [v.passed for v in verdicts]
            assert row["passed"] == verdicts[-1].passed and row["steps"] == verdicts[-1].steps
            assert row["episode"]["first_passed"] == verdicts[0].passed
    figures = stage_result(episodes.root, "reward")["episodes"]
    assert figures["final_pass_rate"] == sum(r["passed"] for r in rows) / len(rows)


def test_a_passing_episode_is_learnt_conditioned_on_its_transcript(episodes):
    samples = {s["sample_id"]: s for s in read_jsonl(episodes.samples)}
    positives = [r for r in read_jsonl(episodes.train_set) if r["source"] == "positive"]
    for record in positives:
        assert record["prompt"] == samples[record["origin"]]["episode"]["prompt"]
        assert record["completion"] == samples[record["origin"]]["completion"]


def test_grpo_trains_whole_episodes_with_the_feedback_masked(episodes, tmp_path):
    """rollouts.jsonl holds each episode's transcript as the tokens its final round read, with the model's
    earlier attempts marked; grpo trains every attempt of an episode as one sequence, the feedback
    between them context only."""
    from transformers import AutoTokenizer

    from closedloop.io import write_jsonl
    from closedloop.models.prompts import prompt_format

    params = load_params(episodes.root)
    tokenizer = AutoTokenizer.from_pretrained(episodes.champion)
    fmt = prompt_format(params.sample, params.model, tokenizer)
    samples = {s["sample_id"]: s for s in read_jsonl(episodes.samples)}
    several = 0
    for rollout in read_jsonl(episodes.rollouts):
        episode = samples[rollout["sample_id"]]["episode"]
        if episode["rounds"] == 1:
            assert "episode" not in rollout
            continue
        several += 1
        record = rollout["episode"]
        assert record["prompt_ids"] == fmt.encode(tokenizer, episode["prompt"])  # what the final round read
        assert 1 <= len(record["model_spans"]) <= episode["rounds"] - 1
        for (start, end), attempt in zip(record["model_spans"], episode["attempts"]):
            assert tokenizer.decode(record["prompt_ids"][start:end]).strip() in attempt
    assert several

    ws = _copy_with(episodes, tmp_path, "grpo-episodes", "train", mode="grpo")
    rows = read_jsonl(ws.rewards)
    for row in rows:  # the tiny policy rarely passes: a reward for each task's first episode gives spread
        row["reward"] = 1.0 if samples[row["sample_id"]]["sample_index"] == 0 else row["reward"]
    write_jsonl(ws.rewards, rows)
    metrics = run_stage("train", ws.root)
    assert metrics["steps"] > 0
    assert metrics["episode_tokens"]["earlier_attempts"] > 0 and metrics["episode_tokens"]["feedback"] > 0
    # the earlier attempts' sampling log-probabilities hold under the transcript the trainer reads
    assert metrics["initial_log_ratio"] < 1e-3


def test_evaluation_reports_pass_at_1_after_each_round_and_the_correction_rate(episodes):
    evaluation = read_json(episodes.evaluation)
    metrics = stage_result(episodes.root, "evaluate")
    for role in ("champion", "candidate"):
        rounds = evaluation[role]["rounds"]
        assert len(rounds["by_round"]) == 3
        assert rounds["by_round"][-1] == evaluation[role]["summary"]  # the gate decides on all rounds
        assert [metrics["rounds"][role]["pass@1"][str(r)] for r in (1, 2, 3)] == \
            [s["overall"]["pass@1"] for s in rounds["by_round"]]
        # and so in the iteration's MLflow run, one chart per round across iterations
        from closedloop.lineage.run_metrics import stage_figures

        figures = stage_figures("evaluate", metrics)
        assert [figures[f"stage/evaluate/rounds.{role}.pass_at_1.{r}"] for r in (1, 2, 3)] == \
            [s["overall"]["pass@1"] for s in rounds["by_round"]]
        correction = rounds["correction_rate"]
        assert 0 <= correction["fixed"] <= correction["failed_first"]


def test_episode_stages_write_the_same_bytes_again(episodes):
    written = {path: path.read_bytes() for path in (episodes.samples, episodes.rewards, episodes.train_set)}
    for name in ("sample", "reward", "grade"):
        run_stage(name, episodes.root)
    assert {path: path.read_bytes() for path in written} == written


def test_a_sample_stage_killed_between_rounds_leaves_nothing_and_reruns_to_the_same_episodes(episodes, tmp_path):
    """SIGKILL after an episode round (sample:round): no sample, rollout or lock entry is half-written,
    and the stage run again (as `closedloop run` resumes it) writes the uninterrupted run's bytes."""
    import os
    import subprocess
    import sys

    ws = _copy_with(episodes, tmp_path, "killed-episodes", "sample")
    outputs = (ws.samples, ws.rollouts)
    for path in outputs:
        path.unlink()
    lock = (ws.root / "dvc.lock").read_bytes() if (ws.root / "dvc.lock").exists() else None
    killed = subprocess.run([sys.executable, "-m", "closedloop.cli", "stage", "sample", "--workspace", str(ws.root)],
                            env={**os.environ, "CLOSEDLOOP_FAULT": "sample:round"}, start_new_session=True,
                            capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not any(path.exists() for path in outputs)
    assert ((ws.root / "dvc.lock").read_bytes() if lock is not None else None) == lock
    run_stage("sample", ws.root)
    assert [path.read_bytes() for path in outputs] == [episodes.samples.read_bytes(), episodes.rollouts.read_bytes()]


def test_an_episode_whose_transcript_would_overflow_the_context_stops_and_says_so(done, tmp_path):
    from transformers import AutoTokenizer

    from closedloop.models.prompts import episode_prompt

    ws = _copy_with(done, tmp_path, "overflow", "sample", rounds=3, max_new_tokens=400, settings_mismatch="warn")
    metrics = run_stage("sample", ws.root)
    samples = read_jsonl(ws.samples)
    stopped = [s for s in samples if s["episode"]["stop"] == "context"]
    assert stopped and metrics["episodes"]["stops"]["context"] == len(stopped)
    tokenizer = AutoTokenizer.from_pretrained(ws.champion)
    tasks = {t["task_id"]: t for t in read_jsonl(ws.tasks)}
    for sample in stopped:
        episode = sample["episode"]
        following = episode_prompt(tasks[sample["task_id"]]["prompt"], list(zip(episode["attempts"], episode["feedback"])))
        assert len(tokenizer(following)["input_ids"]) + 400 > 512


def test_a_transcript_too_long_for_the_context_is_trimmed_to_its_latest_attempts(done, tmp_path):
    """sample.trim_transcript: a transcript that would overflow leaves out its oldest attempts until it
    fits, and the episode goes on; only one whose latest attempt alone overflows stops for its context.
    (150 new tokens: the tiny policy's attempts run long, so most episodes stop at round 2 and one is
    trimmed at round 3, measured.)"""
    from transformers import AutoTokenizer

    from closedloop.models.prompts import episode_prompt

    max_new_tokens = 150
    ws = _copy_with(done, tmp_path, "trimmed", "sample", rounds=3, max_new_tokens=max_new_tokens,
                    trim_transcript=True, settings_mismatch="warn")
    metrics = run_stage("sample", ws.root)
    tokenizer = AutoTokenizer.from_pretrained(ws.champion)
    tasks = {t["task_id"]: t for t in read_jsonl(ws.tasks)}

    def fits(prompt: str) -> bool:
        return len(tokenizer(prompt)["input_ids"]) + max_new_tokens <= 512

    trimmed = 0
    for sample in read_jsonl(ws.samples):
        episode, task = sample["episode"], tasks[sample["task_id"]]["prompt"]
        kept = episode.get("kept_from", 0)
        pairs = list(zip(episode["attempts"], episode["feedback"]))
        if episode["rounds"] > 1:  # the final attempt read the attempts from kept_from on, and they fit
            assert episode["prompt"] == episode_prompt(task, pairs[kept:-1]) and fits(episode["prompt"])
        if kept:  # ... where all of them would not have
            trimmed += 1
            assert not fits(episode_prompt(task, pairs[:-1]))
        if episode["stop"] == "context":  # not even the latest attempt alone would
            assert not fits(episode_prompt(task, pairs[-1:]))
    assert trimmed and trimmed == sum(r.get("trimmed", 0) for r in metrics["episodes"]["per_round"].values())


def test_reward_round_cost_takes_its_cost_per_round_after_the_first(episodes, tmp_path):
    """Episodes whose second attempt is the task's reference: full reward free, 0.1 less at
    reward.round_cost 0.1; the verdict stays the checks'."""
    import yaml

    tasks = {t["task_id"]: t for t in read_jsonl(episodes.tasks)}
    rewarded = {}
    for cost in (0.0, 0.1):
        scratch = tmp_path / f"cost-{cost}"
        shutil.copytree(episodes.root, scratch)
        rows = []
        for sample in read_jsonl(episodes.samples):
            reference, episode = tasks[sample["task_id"]]["reference"], sample["episode"]
            rows.append({**sample, "completion": reference, "episode": {
                **episode, "rounds": 2, "stop": "passed", "attempts": [episode["attempts"][0], reference],
                "visible_passed": [False, True], "feedback": [episode["feedback"][0], "passed the visible checks"]}})
        write_jsonl(scratch / "data/batch/samples.jsonl", rows)
        data = yaml.safe_load((scratch / "params.yaml").read_text())
        data["reward"]["round_cost"] = cost
        (scratch / "params.yaml").write_text(yaml.safe_dump(data))
        run_stage("reward", scratch)
        rewarded[cost] = read_jsonl(Workspace.at(scratch).rewards)
    assert all(row["passed"] and row["reward"] == 1.0 for row in rewarded[0.0])
    for free, costly in zip(rewarded[0.0], rewarded[0.1]):
        assert costly["reward"] == 0.9 and costly["episode"]["reward_before_rounds"] == free["reward"]
        assert costly["passed"] and costly["episode"]["hidden_passed"] == free["episode"]["hidden_passed"] == [False, True]
