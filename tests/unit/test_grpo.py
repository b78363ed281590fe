"""GRPO on real rollouts of a tiny real model: advantages within groups, zero-spread groups skipped,
the recorded sampling log-probabilities aligned with training's, and updates that move the policy
toward what scored higher."""

from __future__ import annotations

from dataclasses import replace

import pytest

from closedloop.config import ShapingParams
from closedloop.rewards.shaping import progress, shaped_reward, step_values
from closedloop.sampling.hf import generate
from closedloop.training.causal_lm import train_causal_lm
from closedloop.training.grpo import Rollout, group_advantages, train_grpo
from tests.unit.test_training import EXAMPLES, _fresh_model, _same, _state, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [f"# Return the {op} of xs, case {i}.\ndef f(xs):\n" for i in range(6) for op in ("sum", "largest")]
GRPO = dict(epochs=3, batch_size=16, lr=3e-3, warmup_steps=2, clip=0.2, beta=0.0, temperature=1.0, seed=5)


def _reward(text: str) -> float:
    """Synthetic verifier: 'sum' is the answer to every prompt, so the update must learn a preference."""
    return 1.0 if "sum(" in text else 0.0


@pytest.fixture(scope="module")
def policy(tokenizer):  # noqa: F811
    return build_policy(tokenizer)


def build_policy(tokenizer):  # noqa: F811
    """A briefly SFT'd model whose samples vary between operations, and its rollouts (k = 8)."""
    model = _fresh_model(tokenizer)
    train_causal_lm(model, tokenizer, EXAMPLES, steps=25, batch_size=16, lr=5e-3, warmup_steps=5, seed=0)
    generations, _ = generate(model, tokenizer, PROMPTS, k=8, temperature=1.0, top_p=1.0, max_new_tokens=16,
                              stop=[], seed=1, batch_size=64)
    rollouts = [Rollout(group=prompt, prompt=prompt, token_ids=g.token_ids, logprobs=g.logprobs, reward=_reward(g.text))
                for prompt, group in zip(PROMPTS, generations) for g in group]
    return model, rollouts


def _mean_logprob(model, tokenizer, rollouts) -> float:  # noqa: F811
    import torch

    total = count = 0.0
    with torch.no_grad():
        for r in rollouts:
            prompt = tokenizer(r.prompt, add_special_tokens=True)["input_ids"]
            ids = torch.tensor([prompt + list(r.token_ids)])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            picked = logp[len(prompt) - 1 :].gather(1, ids[0, len(prompt):, None]).squeeze(1)
            total += float(picked.sum())
            count += len(r.token_ids)
    return total / count


class TestAdvantages:
    def test_normalised_within_the_group(self):
        advantages = group_advantages([1.0, 0.0, 0.0, 1.0])
        assert advantages == pytest.approx([1.0, -1.0, -1.0, 1.0])

    @pytest.mark.parametrize("rewards", [[0.0, 0.0, 0.0], [0.7, 0.7], [1.0]])
    def test_no_spread_no_signal(self, rewards):
        assert group_advantages(rewards) is None


class TestShaping:
    # Step signals as the environments report them.
    NO_PARSE = {"parses": False, "runs": False, "tests_passed": 0, "tests_total": 4}
    RUNS_FAILS = {"parses": True, "runs": True, "tests_passed": 0, "tests_total": 4}
    HALF = {"parses": True, "runs": True, "tests_passed": 2, "tests_total": 4}

    def test_a_sample_that_parses_and_runs_scores_above_one_that_does_not_parse(self):
        shaping = ShapingParams(progress=0.2)
        # Both fail every test, so their combined reward is what the code environment gives each.
        assert shaped_reward(0.2, self.RUNS_FAILS, shaping) > shaped_reward(0.0, self.NO_PARSE, shaping)
        assert shaped_reward(0.6, self.HALF, shaping) > shaped_reward(0.2, self.RUNS_FAILS, shaping)

    def test_steps_become_values_in_order_and_counts_are_fractions(self):
        assert step_values(self.HALF) == {"parses": 1.0, "runs": 1.0, "tests_passed": 0.5}
        assert step_values({"format_ok": True, "R1": False, "note": "x", "skipped": None}) == {"format_ok": 1.0, "R1": 0.0}
        assert progress({"valid_json": True, "schema_valid": False, "field_precision": 0.5, "field_recall": 0.5}) == 0.5

    def test_named_step_weights_add_to_the_reward(self):
        shaping = ShapingParams(progress=0.0, steps={"runs": 0.5})
        assert shaped_reward(0.1, self.RUNS_FAILS, shaping) == pytest.approx(0.6)
        assert shaped_reward(0.1, self.NO_PARSE, shaping) == pytest.approx(0.1)

    def test_a_passed_base_is_the_verdict_not_the_partial_credit(self):
        shaping = ShapingParams(progress=0.0, base="passed")
        # 0.6 of partial credit that failed scores as any failure; a pass scores 1 whatever its components
        assert shaped_reward(0.6, self.HALF, shaping, passed=False) == 0.0
        assert shaped_reward(0.9, self.HALF, shaping, passed=True) == 1.0
        assert shaped_reward(0.2, self.RUNS_FAILS, ShapingParams(progress=0.2, base="passed"), passed=False) == \
            pytest.approx(0.2 * 2 / 3)  # the step shaping still adds
        with pytest.raises(ValueError, match="verdict"):
            shaped_reward(0.6, self.HALF, shaping)

    def test_shaping_gives_groups_of_failures_a_direction(self):
        """Every sample failed every test, but one ran: the group now has a spread, and the advantage
        points at the one that ran."""
        shaping = ShapingParams()
        rewards = [shaped_reward(0.0, self.NO_PARSE, shaping), shaped_reward(0.2, self.RUNS_FAILS, shaping)]
        advantages = group_advantages(rewards)
        assert advantages is not None and advantages[1] > 0 > advantages[0]


class TestTrainGrpo:
    def test_recorded_logprobs_match_the_training_forward(self, policy, tokenizer):  # noqa: F811
        """The first batch's policy ratio is 1: rollouts carry exactly the tokens and log-probabilities
        the trainer recomputes (same BOS, same token boundary, same temperature)."""
        import copy

        model, rollouts = policy
        stats = train_grpo(copy.deepcopy(model), tokenizer, rollouts, **{**GRPO, "epochs": 0.1})
        assert stats.steps >= 1
        assert stats.initial_log_ratio < 1e-3

    def test_update_moves_the_policy_toward_higher_reward(self, policy, tokenizer):  # noqa: F811
        import copy

        model, rollouts = policy
        good = [r for r in rollouts if r.reward == 1.0]
        bad = [r for r in rollouts if r.reward == 0.0]
        assert good and bad, "the rollouts need both outcomes for this test to mean anything"
        trained = copy.deepcopy(model)
        stats = train_grpo(trained, tokenizer, rollouts, **GRPO)
        assert stats.steps > 0 and stats.tokens > 0 and stats.tokens_per_s > 0
        assert stats.groups == len(PROMPTS) and 0 <= stats.skipped_groups < stats.groups
        gain_good = _mean_logprob(trained, tokenizer, good) - _mean_logprob(model, tokenizer, good)
        gain_bad = _mean_logprob(trained, tokenizer, bad) - _mean_logprob(model, tokenizer, bad)
        assert gain_good > 0.05 and gain_bad < gain_good

    def test_groups_without_spread_are_skipped_and_counted(self, policy, tokenizer):  # noqa: F811
        import copy

        model, rollouts = policy
        flat = [Rollout(r.group, r.prompt, r.token_ids, r.logprobs, 0.5) for r in rollouts]
        untouched = copy.deepcopy(model)
        before = _state(untouched)
        stats = train_grpo(untouched, tokenizer, flat, **GRPO)
        assert stats.steps == 0 and stats.skipped_groups == len(PROMPTS) and stats.rollouts == 0
        assert _same(before, _state(untouched))

    def test_deterministic(self, policy, tokenizer):  # noqa: F811
        import copy

        model, rollouts = policy
        a, b = copy.deepcopy(model), copy.deepcopy(model)
        train_grpo(a, tokenizer, rollouts, **{**GRPO, "epochs": 1})
        train_grpo(b, tokenizer, rollouts, **{**GRPO, "epochs": 1})
        assert _same(_state(a), _state(b))

    def test_kl_penalty_holds_the_policy_closer(self, policy, tokenizer):  # noqa: F811
        """With beta > 0 the trained policy stays nearer the sampling policy: the KL estimated on the
        rollouts (mean old minus new log-probability of the sampled tokens) is smaller."""
        import copy

        model, rollouts = policy
        free, held = copy.deepcopy(model), copy.deepcopy(model)
        train_grpo(free, tokenizer, rollouts, **GRPO)
        train_grpo(held, tokenizer, rollouts, **{**GRPO, "beta": 1.0})
        start = _mean_logprob(model, tokenizer, rollouts)
        kl_free = start - _mean_logprob(free, tokenizer, rollouts)
        kl_held = start - _mean_logprob(held, tokenizer, rollouts)
        assert kl_held < kl_free

    def test_greedy_rollouts_are_refused(self, policy, tokenizer):  # noqa: F811
        model, rollouts = policy
        with pytest.raises(ValueError, match="temperature > 0"):
            train_grpo(model, tokenizer, rollouts, **{**GRPO, "temperature": 0.0})

    def test_mismatched_tokens_and_logprobs_are_refused(self, policy, tokenizer):  # noqa: F811
        model, rollouts = policy
        broken = [Rollout(r.group, r.prompt, r.token_ids, r.logprobs[:-1], r.reward) for r in rollouts]
        with pytest.raises(ValueError, match="log-probabilities"):
            train_grpo(model, tokenizer, broken, **GRPO)


class TestTrainerFigures:
    """What TRL and verl log for GRPO, per step and over the run (GrpoStats.steps_log, run_figures)."""

    def test_every_step_is_logged_with_the_field_s_figures(self, policy, tokenizer):  # noqa: F811
        import copy
        import math

        model, rollouts = policy
        stats = train_grpo(copy.deepcopy(model), tokenizer, rollouts, **GRPO)
        log = stats.steps_log
        assert [r["step"] for r in log] == list(range(1, stats.steps + 1))
        assert [r["loss"] for r in log] == stats.losses
        # warm-up: the first step runs at a fraction of lr, the peak is lr, and it decays after
        assert log[0]["lr"] < GRPO["lr"] and max(r["lr"] for r in log) == pytest.approx(GRPO["lr"])
        assert log[-1]["lr"] < GRPO["lr"]
        assert all(r["grad_norm"] > 0 for r in log)
        # The first step's policy is the sampling policy: ratio 1, nothing clipped, KL 0.
        assert log[0]["kl"] == pytest.approx(0.0, abs=1e-6) and log[0]["clip_low"] == log[0]["clip_high"] == 0
        assert any(r["kl"] > 1e-4 for r in log[1:]), "later steps should move away from the sampling policy"
        vocab = len(tokenizer)
        assert all(0 < r["entropy"] <= math.log(vocab) for r in log)
        assert all(0 <= r["clip_low"] <= 1 and 0 <= r["clip_high"] <= 1 for r in log)
        # at lr 3e-3 over 3 epochs the ratio leaves the clip range, and the clip binds, on some later step
        assert stats.clip_fraction > 0 and any(r["clip_low"] + r["clip_high"] > 0 for r in log[1:])
        figures = stats.run_figures()
        assert figures["entropy_first"] == pytest.approx(log[0]["entropy"], abs=1e-6)
        assert figures["grad_norm_max"] == pytest.approx(max(r["grad_norm"] for r in log), abs=1e-6)
        assert figures["lr_max"] == pytest.approx(GRPO["lr"])

    def test_the_batch_figures_are_the_groups_and_advantages_trained_on(self, policy, tokenizer):  # noqa: F811
        import copy
        import statistics

        model, rollouts = policy
        stats = train_grpo(copy.deepcopy(model), tokenizer, rollouts, **{**GRPO, "epochs": 0.1})
        assert stats.zero_std_share == pytest.approx(stats.skipped_groups / stats.groups)
        # Scaled advantages are centred and of unit spread within each group, so over the batch too.
        assert stats.advantage_mean == pytest.approx(0.0, abs=1e-9)
        assert stats.advantage_std == pytest.approx(1.0, abs=1e-6)
        trained = [r for r in rollouts if statistics.pstdev(x.reward for x in rollouts if x.group == r.group) > 0]
        assert stats.completion_length_mean == pytest.approx(statistics.fmean(len(r.token_ids) for r in trained))
        flat = [Rollout(r.group, r.prompt, r.token_ids, r.logprobs, 0.5) for r in rollouts]
        nothing = train_grpo(copy.deepcopy(model), tokenizer, flat, **GRPO)
        assert nothing.zero_std_share == 1.0 and nothing.steps_log == []
        assert set(nothing.run_figures().values()) == {None}


class TestReplaySelection:
    """Which earlier positives the rft training set takes back (the DVC reading is tested in flows)."""

    @staticmethod
    def _row(task: str, completion: str, source: str = "positive") -> dict:
        return {"source": source, "task_id": task, "origin": f"{task}#0", "prompt": f"p-{task}", "completion": completion}

    def test_positives_not_already_present_most_recent_first(self):
        from closedloop.training.modes.rft import select_replay

        current = [self._row("a", "x"), self._row("b", "y"), self._row("c", "z"), self._row("d", "w")]
        batches = {
            "iter-001": [self._row("a", "x"), self._row("e", "old"), self._row("f", "fix", source="fix")],
            "iter-002": [self._row("g", "new"), self._row("e", "old")],
        }
        kept, mix = select_replay(current, batches, max_fraction=0.5)
        assert [(r["task_id"], r["completion"]) for r in kept] == [("g", "new"), ("e", "old")]
        assert mix == {"iter-001": 0, "iter-002": 2}
        assert all(r["source"] == "replay" for r in kept) and kept[0]["origin"] == "iter-002:g#0"

    def test_capped_at_the_fraction_of_the_training_set(self):
        from closedloop.training.modes.rft import select_replay

        current = [self._row(str(i), "c") for i in range(3)]
        batches = {"iter-001": [self._row(f"old{i}", "c") for i in range(10)]}
        kept, mix = select_replay(current, batches, max_fraction=0.25)  # 1 / (3 + 1) = 0.25
        assert len(kept) == 1 and mix == {"iter-001": 1}
        assert select_replay(current, batches, max_fraction=0.0) == ([], {"iter-001": 0})


# The child process: the same policy and rollouts as this module, GRPO with checkpoints until killed.
CHILD = """
import sys, torch
torch.set_num_threads(1)
from pathlib import Path
from closedloop.models.builtin import train_tokenizer
from closedloop.training.checkpoints import Checkpointing
from closedloop.training.grpo import train_grpo
from tests.unit.test_training import EXAMPLES, TINY
from tests.unit.test_grpo import GRPO, build_policy
tokenizer = train_tokenizer([e.prompt + e.completion for e in EXAMPLES], TINY.vocab_size)
model, rollouts = build_policy(tokenizer)
train_grpo(model, tokenizer, rollouts, checkpoint=Checkpointing(Path(sys.argv[1]), 2, {"run": "grpo"}),
           **{**GRPO, "epochs": 4})
"""


def test_a_killed_grpo_run_resumes_to_the_uninterrupted_result(policy, tokenizer, tmp_path):  # noqa: F811
    import copy
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from closedloop.training.checkpoints import Checkpointing
    from tests.unit.test_training_resume import _checkpoint_step

    model, rollouts = policy
    uninterrupted = copy.deepcopy(model)
    reference = train_grpo(uninterrupted, tokenizer, rollouts, **{**GRPO, "epochs": 4})
    directory = tmp_path / "candidate.checkpoint"
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory)], cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)})
    try:
        deadline = time.monotonic() + 120
        while _checkpoint_step(directory) < reference.steps // 3 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    killed_at = _checkpoint_step(directory)
    assert child.returncode == -signal.SIGKILL and 2 <= killed_at < reference.steps, killed_at
    resumed = copy.deepcopy(model)
    stats = train_grpo(resumed, tokenizer, rollouts, checkpoint=Checkpointing(directory, 2, {"run": "grpo"}),
                       **{**GRPO, "epochs": 4})
    assert _same(_state(resumed), _state(uninterrupted)) and stats.losses == reference.losses
    assert stats.steps_log == reference.steps_log  # the steps before the kill came back with the checkpoint


class TestAdvantageOptions:
    def test_unscaled_advantages_are_plain_differences_from_the_mean(self):
        assert group_advantages([1.0, 0.0, 0.0, 0.0], scale=False) == pytest.approx([0.75, -0.25, -0.25, -0.25])

    def test_negative_weight_scales_only_below_mean_advantages(self):
        assert group_advantages([1.0, 0.0], negative_weight=0.5) == pytest.approx([1.0, -0.5])
        assert group_advantages([1.0, 0.0], negative_weight=0.0) == pytest.approx([1.0, 0.0])


class TestBehaviourLogprobs:
    """The behaviour log-probabilities: the sampler's where it returned them, the trainer's (the
    champion before any update) where it did not; and the two agree."""

    def test_missing_logprobs_are_recomputed_as_the_sampler_gave_them(self, policy, tokenizer):  # noqa: F811
        import copy

        from closedloop.training.grpo import policy_logprobs

        model, rollouts = policy
        rows = [(tokenizer(r.prompt)["input_ids"], list(r.token_ids)) for r in rollouts]
        computed = policy_logprobs(model, rows, temperature=GRPO["temperature"], batch_size=16,
                                   pad_id=tokenizer.pad_token_id)
        deltas = [abs(a - b) for r, lp in zip(rollouts, computed) for a, b in zip(r.logprobs, lp)]
        assert len(deltas) == sum(len(r.token_ids) for r in rollouts) and max(deltas) < 1e-5

        sampled = train_grpo(copy.deepcopy(model), tokenizer, rollouts, **GRPO)
        missing = [Rollout(r.group, r.prompt, r.token_ids, None, r.reward) for r in rollouts]
        recomputed = train_grpo(copy.deepcopy(model), tokenizer, missing, **GRPO)
        assert sampled.behaviour_logprobs == "sampler" and recomputed.behaviour_logprobs == "trainer"
        assert sampled.logprob_delta_max < 1e-5 and sampled.logprob_delta_mean < 1e-6
        assert recomputed.logprob_delta_max is None and recomputed.initial_log_ratio < 1e-5
        assert recomputed.losses == pytest.approx(sampled.losses, abs=1e-5)

    def test_a_mix_is_named_and_the_deltas_cover_only_the_sampled_values(self, policy, tokenizer):  # noqa: F811
        import copy

        model, rollouts = policy
        mixed = [r if i % 2 else Rollout(r.group, r.prompt, r.token_ids, None, r.reward) for i, r in enumerate(rollouts)]
        stats = train_grpo(copy.deepcopy(model), tokenizer, mixed, **{**GRPO, "epochs": 0.1})
        assert stats.behaviour_logprobs == "mixed" and stats.logprob_delta_max < 1e-5

    def test_micro_batches_give_the_full_batch_steps(self, policy, tokenizer):  # noqa: F811
        import copy

        model, rollouts = policy
        whole, parts = copy.deepcopy(model), copy.deepcopy(model)
        settings = {**GRPO, "epochs": 1, "lr": 1e-4}
        a = train_grpo(whole, tokenizer, rollouts, **settings)
        b = train_grpo(parts, tokenizer, rollouts, **settings, micro_batch_size=5)
        assert b.losses == pytest.approx(a.losses, abs=1e-6) and b.tokens == a.tokens
        assert max(float((_state(whole)[k] - _state(parts)[k]).abs().max()) for k in _state(whole)) < 1e-6


def _gpt2_with_dropout(tokenizer, p: float = 0.1):  # noqa: F811
    """A tiny GPT-2 whose config has dropout everywhere (embeddings, attention, residuals), briefly SFT'd."""
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    train_causal_lm(model, tokenizer, EXAMPLES, steps=25, batch_size=16, lr=5e-3, warmup_steps=5, seed=0)
    return model


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_policy_ratios_are_taken_with_dropout_off(tokenizer, gradient_checkpointing):  # noqa: F811
    """With dropout 0.1 on, the first step's log ratio against the sampler's log-probabilities was ~1.4
    (measured); with dropout off in training it is rounding noise, also under activation checkpointing
    (which then still recomputes: the attention runs three times, pre-pass, forward and backward)."""
    model = _gpt2_with_dropout(tokenizer)
    generations, _ = generate(model, tokenizer, PROMPTS, k=8, temperature=1.0, top_p=1.0, max_new_tokens=16,
                              stop=[], seed=1, batch_size=64)
    rollouts = [Rollout(prompt, prompt, g.token_ids, g.logprobs, 1.0 if i % 2 else 0.0)
                for prompt, group in zip(PROMPTS, generations) for i, g in enumerate(group)]
    calls = []
    model.transformer.h[0].attn.register_forward_hook(lambda *_: calls.append(1))
    stats = train_grpo(model, tokenizer, rollouts, **{**GRPO, "epochs": 0.1},
                       gradient_checkpointing=gradient_checkpointing)
    assert stats.steps == 1 and stats.behaviour_logprobs == "sampler"
    assert stats.logprob_delta_max < 1e-5 and stats.initial_log_ratio < 1e-5
    batches = -(-len(rollouts) // GRPO["batch_size"])  # the pre-pass runs in training-sized batches
    assert len(calls) == batches + (2 if gradient_checkpointing else 1)
    assert not model.training and not any(m.training for m in model.modules())


class TestRounds:
    """On-policy rounds (train.grpo.rounds): the batch's tasks in parts, the runs' figures as one."""

    def test_the_parts_cover_every_task_once_in_near_equal_sizes_and_mix_the_order(self):
        from closedloop.training.rounds import round_parts

        tasks = [f"code-{i:03d}" for i in range(50)] + [f"rules-{i:03d}" for i in range(50)]
        parts = round_parts(tasks, 3, seed=7)
        assert sorted(t for part in parts for t in part) == sorted(tasks)
        assert [len(part) for part in parts] == [33, 33, 34]
        assert all(any(t.startswith("rules") for t in part) and any(t.startswith("code") for t in part)
                   for part in parts)  # the tasks file is ordered by environment; every part holds both
        assert parts == round_parts(tasks, 3, seed=7) and parts != round_parts(tasks, 3, seed=8)
        assert sorted(round_parts(tasks, 1, seed=7)[0]) == sorted(tasks)

    def test_two_runs_combine_into_one_run_s_figures(self, policy, tokenizer):  # noqa: F811
        import copy

        from closedloop.training.grpo_stats import combine_stats

        model, rollouts = policy
        half = len(rollouts) // 2
        trained = copy.deepcopy(model)
        first = train_grpo(trained, tokenizer, rollouts[:half], **GRPO)
        second = train_grpo(trained, tokenizer, rollouts[half:], **GRPO)
        both = combine_stats([first, second])
        assert combine_stats([first]) is first
        assert both.steps == first.steps + second.steps and both.tokens == first.tokens + second.tokens
        assert both.groups == first.groups + second.groups
        assert both.skipped_groups == first.skipped_groups + second.skipped_groups
        assert both.zero_std_share == pytest.approx(both.skipped_groups / both.groups)
        assert [r["step"] for r in both.steps_log] == list(range(1, both.steps + 1))
        assert [r["loss"] for r in both.steps_log] == first.losses + second.losses == both.losses
        assert both.first_loss == first.first_loss and both.final_loss == second.final_loss
        assert min(first.clip_fraction, second.clip_fraction) <= both.clip_fraction <= max(
            first.clip_fraction, second.clip_fraction)
        with pytest.raises(ValueError, match="no grpo runs"):
            combine_stats([])


class TestLossPresets:
    """train.grpo.loss as TRL names it, and clip-higher (epsilon_high)."""

    @staticmethod
    def _trained(rollouts) -> list[tuple[float, int]]:
        """(advantage, completion length) of every rollout a run trains on: groups with a spread."""
        from closedloop.training.grpo import group_advantages

        groups: dict = {}
        for r in rollouts:
            groups.setdefault(r.group, []).append(r)
        trained = []
        for members in groups.values():
            advantages = group_advantages([r.reward for r in members])
            if advantages:
                trained += [(a, len(r.token_ids)) for r, a in zip(members, advantages) if r.token_ids]
        return trained

    def _first_step(self, policy, tokenizer, **settings):  # noqa: F811
        import copy

        model, rollouts = policy
        # one step over every trained rollout once: the policy is the sampling policy, so each token's
        # objective is its advantage (ratio 1) and the loss is only how the presets weigh tokens
        return train_grpo(copy.deepcopy(model), tokenizer, rollouts,
                          **{**GRPO, "epochs": 1, "batch_size": len(self._trained(rollouts)), **settings})

    def test_each_preset_weighs_the_tokens_as_it_says(self, policy, tokenizer):  # noqa: F811
        trained = self._trained(policy[1])
        longest = 16
        dapo = self._first_step(policy, tokenizer, loss="dapo")
        grpo = self._first_step(policy, tokenizer, loss="grpo")
        dr = self._first_step(policy, tokenizer, loss="dr_grpo", max_completion_length=longest)
        tokens = sum(n for _, n in trained)
        assert dapo.first_loss == pytest.approx(-sum(a * n for a, n in trained) / tokens, abs=1e-5)
        assert grpo.first_loss == pytest.approx(-sum(a for a, _ in trained) / len(trained), abs=1e-5)
        assert dr.first_loss == pytest.approx(-sum(a * n for a, n in trained) / (len(trained) * longest), abs=1e-5)

    def test_micro_batches_give_the_full_batch_loss_for_every_preset(self, policy, tokenizer):  # noqa: F811
        for loss in ("grpo", "dr_grpo"):
            whole = self._first_step(policy, tokenizer, loss=loss, max_completion_length=16)
            parts = self._first_step(policy, tokenizer, loss=loss, max_completion_length=16, micro_batch_size=7)
            assert parts.first_loss == pytest.approx(whole.first_loss, abs=1e-5)

    def test_clip_higher_raises_only_the_upper_bound(self, policy, tokenizer):  # noqa: F811
        import copy

        model, rollouts = policy
        default = train_grpo(copy.deepcopy(model), tokenizer, rollouts, **GRPO)
        higher = train_grpo(copy.deepcopy(model), tokenizer, rollouts, **GRPO, clip_high=0.9)
        assert default.steps_log[0]["clip_high"] == higher.steps_log[0]["clip_high"] == 0
        assert sum(r["clip_high"] for r in higher.steps_log) < sum(r["clip_high"] for r in default.steps_log)

    def test_unknown_presets_and_a_dr_grpo_without_a_length_are_refused(self, policy, tokenizer):  # noqa: F811
        model, rollouts = policy
        with pytest.raises(ValueError, match="loss 'ppo': expected one of dapo, grpo, dr_grpo"):
            train_grpo(model, tokenizer, rollouts, **GRPO, loss="ppo")
        with pytest.raises(ValueError, match="max_completion_length"):
            train_grpo(model, tokenizer, rollouts, **GRPO, loss="dr_grpo")


def test_rounds_carry_one_optimizer_and_one_schedule(policy, tokenizer):  # noqa: F811
    """On-policy rounds go on with the optimizer and schedule of the rounds before: the second run's
    first step is not a new warm-up, and AdamW's step count runs over both."""
    import copy

    from closedloop.training.optimization import Carry

    model, rollouts = policy
    half = len(rollouts) // 2
    settings = {**GRPO, "epochs": 1, "batch_size": 8, "warmup_steps": 3}
    carry = Carry(total_steps=40)
    trained = copy.deepcopy(model)
    first = train_grpo(trained, tokenizer, rollouts[:half], **settings, carry=carry)
    second = train_grpo(trained, tokenizer, rollouts[half:], **settings, carry=carry)
    assert first.steps > settings["warmup_steps"] and second.steps > 0
    peak = settings["lr"]
    assert first.steps_log[0]["lr"] < peak / 2  # the one warm-up
    assert second.steps_log[0]["lr"] == pytest.approx(
        first.steps_log[-1]["lr"], rel=0.2) and second.steps_log[0]["lr"] > peak / 2
    steps = {int(state["step"]) for state in carry.optimizer.state.values()}
    assert steps == {first.steps + second.steps}
    fresh = train_grpo(copy.deepcopy(trained), tokenizer, rollouts[half:], **settings)
    assert fresh.steps_log[0]["lr"] < peak / 2  # without a carry, each run warms up again


class TestEpisodes:
    """grpo over whole episodes (sample.rounds > 1): one sequence from the first attempt to the end of
    the final one, the loss on the model's own tokens only; the feedback between them is context."""

    FEEDBACK = "# Error: f([1, 2]) returned 2, expected 3\n# Corrected:\n"

    def _episodes(self, policy, tokenizer):  # noqa: F811
        """Two-round episodes built from the policy's own rollouts: attempt 1 (with its sampling
        log-probabilities), the feedback, the task again, attempt 2 (sampled on the task alone, so its
        figures are left to the trainer)."""
        from closedloop.training.grpo import Transcript

        _, rollouts = policy
        episodes = []
        for first, final in zip(rollouts[0::2], rollouts[1::2]):
            task = tokenizer(first.prompt, add_special_tokens=True)["input_ids"]
            between = tokenizer(self.FEEDBACK + first.prompt, add_special_tokens=False)["input_ids"]
            ids = task + list(first.token_ids) + between
            transcript = Transcript(tuple(ids), ((len(task), len(task) + len(first.token_ids)),), (first.logprobs,))
            episodes.append(Rollout(final.group, final.prompt, final.token_ids, None, final.reward,
                                    transcript=transcript))
        return episodes

    def test_the_loss_covers_every_attempt_and_none_of_the_feedback(self, policy, tokenizer):  # noqa: F811
        import torch

        from closedloop.training.grpo import GrpoLoss, _advantage_rows, _behaviour_logprobs

        model, _ = policy
        episodes = self._episodes(policy, tokenizer)
        groups = {}
        for rollout in episodes:
            groups.setdefault(rollout.group, []).append(rollout)
        rows, _ = _advantage_rows(groups, tokenizer, True, 1.0, None)
        trained = [r for name in sorted(groups) if group_advantages([x.reward for x in groups[name]])
                   for r in groups[name] if r.token_ids]
        assert rows and len(rows) == len(trained)
        for row, rollout in zip(rows, trained):
            transcript = rollout.transcript
            (lo, hi), = transcript.spans
            assert len(row.prompt) == lo  # the context ends where the first attempt begins
            feedback = len(transcript.prompt_ids) - hi
            assert row.model == [1] * (hi - lo) + [0] * feedback + [1] * (len(row.completion) - (hi - lo) - feedback)
            assert row.earlier == hi - lo
        rows, _ = _behaviour_logprobs(model, rows, temperature=1.0, batch_size=16, pad_id=tokenizer.eos_token_id)

        def loss_of(rows) -> float:
            step = GrpoLoss(model, rows, tokenizer.eos_token_id, temperature=1.0, clip=0.2, upper=0.2, beta=0.04,
                            loss="dapo", max_completion_length=None)
            with torch.no_grad():
                return float(step(list(range(len(rows))), None)[0])

        def poisoned(where) -> list:  # behaviour log-probabilities of -30 at the positions ``where`` picks
            return [replace(row, logprobs=[-30.0 if where(row, i) else lp for i, lp in enumerate(row.logprobs)])
                    for row in rows]

        base = loss_of(rows)
        # the feedback's behaviour figures never enter the loss: poisoning them changes nothing ...
        assert loss_of(poisoned(lambda row, i: not row.model[i])) == base
        # ... while an earlier attempt's, or the final one's, do
        assert loss_of(poisoned(lambda row, i: i < row.earlier)) != base
        assert loss_of(poisoned(lambda row, i: i >= len(row.completion) - 1)) != base

    def test_episodes_train_and_report_what_was_trained_and_what_was_context(self, policy, tokenizer):  # noqa: F811
        import copy

        model, _ = policy
        episodes = self._episodes(policy, tokenizer)
        stats = train_grpo(copy.deepcopy(model), tokenizer, episodes, **{**GRPO, "epochs": 1})
        assert stats.steps > 0 and stats.behaviour_logprobs == "mixed"
        # the first attempts' sampling figures hold under the transcript's context
        assert stats.logprob_delta_max < 1e-4
        trained = [r for r in episodes if len({x.reward for x in episodes if x.group == r.group}) > 1]
        assert stats.earlier_attempt_tokens == sum(len(r.transcript.prompt_ids) - r.transcript.spans[0][0]
                                                   - (len(r.transcript.prompt_ids) - r.transcript.spans[0][1])
                                                   for r in trained)
        assert stats.feedback_tokens == sum(len(r.transcript.prompt_ids) - r.transcript.spans[0][1] for r in trained)
