"""The monitors: each one tripped by a batch built to trip it, none by a normal pair of batches,
and the statistics under them checked against values worked by hand."""

from __future__ import annotations

import math
import random
import time

import pytest

from closedloop.config import MONITOR_NAMES, WARN_ONLY_MONITORS, ConfigError, MonitorsParams, parse_params
from closedloop.monitors import VERDICT_CODES, IterationData, numbers, report, run_monitors
from closedloop.monitors.registry import MONITORS
from closedloop.monitors.stats import (ks_critical, ks_statistic, mean_rise_z, pearson, proportion_rise_z, psi,
                                       psi_from_counts, ranks, spearman)

SURFACE = {"code": ("syntax", "runs"), "extract": ("format", "schema")}
TASK = {"code": "tests_passed", "extract": "fields"}


def batch(iteration: int, seed: int = 0, *, envs=("code", "extract"), tasks=16, k=4, pass_rate=0.5,
          surface_fail=0.6, fail_extra=0, timeout_rate=0.0, verifier=None, pass_at_1=0.5, grpo=False,
          equal_groups=False, entropy=1.0, canary_changes=0, episodes=False, lost_rate=0.0,
          echo_rate=0.0) -> IterationData:
    """One iteration's records, drawn from a policy described by the knobs; two calls with the same
    knobs and different seeds are two normal iterations of the same policy."""
    rng = random.Random(seed * 1000 + iteration)
    samples, rewards, rollouts, canary = [], [], [], []
    for env in envs:
        version = (verifier or {}).get(env, f"{env}-v1")
        for t in range(tasks):
            task_id = f"{env}-{t}"
            group_pass = rng.random() < pass_rate  # equal_groups: every sample of the task alike
            for i in range(k):
                sample_id = f"{task_id}#{i}"
                passed = group_pass if equal_groups else rng.random() < pass_rate
                status = "passed" if passed else "failed"
                if rng.random() < timeout_rate:
                    passed, status = False, "timeout"
                if status == "timeout":
                    parts = {name: 0.0 for name in (*SURFACE[env], TASK[env])}
                else:
                    surface = 1.0 if passed or equal_groups or rng.random() < surface_fail else 0.0
                    task = 1.0 if passed else (0.0 if equal_groups else rng.choice((0.0, 0.25, 0.5)))
                    parts = {**{name: surface for name in SURFACE[env]}, TASK[env]: task}
                reward = round(0.1 * sum(parts[name] for name in SURFACE[env]) + 0.8 * parts[TASK[env]], 6)
                length = rng.randint(40, 120) + (0 if passed else fail_extra)
                samples.append({"sample_id": sample_id, "task_id": task_id, "env": env, "completion": "x" * length})
                rewards.append({"sample_id": sample_id, "task_id": task_id, "env": env, "components": parts,
                                "reward": reward, "passed": passed, "status": status,
                                "feedback_sources": {f"verifier:{env}": version, "combiner": "c1"}})
                if episodes:  # sample.rounds 3: what later rounds did on the hidden checks
                    rewards[-1]["episode"] = {"rounds": 3, "hidden_lost": rng.random() < lost_rate,
                                              "echoed": int(rng.random() < echo_rate)}
                rollouts.append({"sample_id": sample_id, "token_ids": [1] * 8,
                                 "logprobs": [-rng.uniform(0.5, 1.5) * entropy for _ in range(8)]})
        for t in range(4):
            for kind, reward in (("reference", 1.0), ("blank", 0.0)):
                changed = len(canary) < canary_changes and kind == "reference"
                canary.append({"canary_id": f"{env}-b{t}#{kind}", "env": env, "task_id": f"{env}-b{t}", "kind": kind,
                               "reward": 0.9 if changed else reward, "passed": not changed and kind == "reference",
                               "status": "failed" if changed or kind == "blank" else "passed",
                               "verifier": f"verifier:{env}", "verifier_version": version})
    evaluation = {"champion": {"summary": {"overall": {"pass@1": pass_at_1},
                                           "envs": {env: {"pass@1": pass_at_1} for env in envs}}}}
    train = {"clip_fraction": 0.05, "logprob_delta_mean": 0.01, "logprob_delta_max": 0.2} if grpo else {"steps": 2}
    return IterationData(iteration, f"iter-{iteration:03d}-abcdef12", samples, rewards, rollouts, train,
                         evaluation, canary)


def results(current, history, **settings):
    return {r.name: r for r in run_monitors(current, history, MonitorsParams(**settings))}


class TestNormalBatches:
    @pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
    def test_a_normal_pair_trips_nothing(self, seed):
        # the same policy twice (GRPO, so grpo_health judges too): every monitor ok or skipped with a reason
        history = [batch(1, seed, grpo=True), batch(2, seed, grpo=True)]
        found = results(batch(3, seed, grpo=True, episodes=True), history)
        assert list(found) == list(MONITOR_NAMES)
        for name, result in found.items():
            assert result.verdict == "ok", f"{name}: {result.message}"
        assert found["reward_shift"].figures["code/reward.psi"] >= 0  # compared, not skipped

    def test_without_history_each_says_why_it_skipped(self):
        found = results(batch(1), [])
        for name in ("reward_shift", "verifier_shift", "proxy_gold_divergence", "length_inflation",
                     "format_only_wins", "canary"):
            assert found[name].verdict == "skipped" and found[name].value is None
            assert "previous" in found[name].message, name
        assert "not a grpo iteration" in found["grpo_health"].message
        assert found["anomaly_rates"].verdict == "ok"  # rates are judged against zero then

    def test_grpo_health_reports_the_trainer_s_figures_without_judging_them(self):
        import dataclasses

        history = [batch(1, 3, grpo=True), batch(2, 3, grpo=True)]
        plain = batch(3, 3, grpo=True)
        trainer = {"frac_reward_zero_std": 0.18, "advantage_std": 0.97, "clip_low": 0.01, "clip_high": 0.02,
                   "kl_mean": 0.004, "entropy_first": 1.9, "entropy_last": 1.7, "grad_norm_max": 3.5,
                   "truncated_share": 0.3}
        logged = dataclasses.replace(plain, train={**plain.train, **trainer})
        before, after = results(plain, history)["grpo_health"], results(logged, history)["grpo_health"]
        assert {key: after.figures[key] for key in trainer} == pytest.approx(trainer)
        assert (after.verdict, after.value) == (before.verdict, before.value)

    def test_a_tiny_batch_is_not_judged_on_noise(self):
        # the tiny test run's size (about 20 samples), the same policy drawn again
        for seed in range(10):
            found = results(batch(2, seed, tasks=3, k=3), [batch(1, seed, tasks=3, k=3)])
            assert all(r.verdict in ("ok", "skipped") for r in found.values()), \
                {n: r.message for n, r in found.items() if r.verdict not in ("ok", "skipped")}

    def test_disabled_skips_everything(self):
        found = results(batch(2), [batch(1)], enabled=False)
        assert {r.verdict for r in found.values()} == {"skipped"}
        assert all(r.message == "monitors.enabled is false" for r in found.values())


class TestEachMonitorTrips:
    @pytest.mark.parametrize("name, current, verdict, said", [
        # the reward distribution moved a lot: warns by default (a policy that learns moves it)
        ("reward_shift", dict(pass_rate=0.95), "warn", "PSI"),
        # code's verifier version changed: warns by default (a change is often intended)
        ("verifier_shift", dict(verifier={"code": "code-v2"}), "warn", "code code-v1 -> code-v2"),
        # the batch's reward rose while the champion's pass@1 fell
        ("proxy_gold_divergence", dict(pass_rate=0.8, pass_at_1=0.4), "fail", "pass@1 -0.1"),
        # completions grow longer while failing
        ("length_inflation", dict(fail_extra=150), "fail", "failed samples' mean length"),
        # wins only on format: surface components up, the task's down
        ("format_only_wins", dict(surface_fail=1.0, pass_rate=0.4), "fail", "format/schema +0.266 while fields"),
        # every group's k samples alike: GRPO has nothing to learn from
        ("grpo_health", dict(grpo=True, equal_groups=True), "fail", "zero_variance_share 1"),
        # entropy collapsing: the sampled tokens' surprisal fell by 90%
        ("grpo_health", dict(grpo=True, entropy=0.1), "fail", "entropy_drop"),
        # a burst of timeouts
        ("anomaly_rates", dict(timeout_rate=0.3), "fail", "/timeout at"),
        # a stored completion scores differently today
        ("canary", dict(canary_changes=1), "fail", "1 of 16 canary completions"),
        # episodes whose later rounds undo what an earlier round had right on the hidden checks
        ("episode_gaming", dict(episodes=True, lost_rate=0.4), "fail", "lost a hidden-check pass"),
        # later attempts that quote the feedback they were shown
        ("episode_gaming", dict(episodes=True, echo_rate=0.4), "fail", "quoted the feedback"),
    ])
    def test_tripped(self, name, current, verdict, said):
        grpo = current.get("grpo", False)
        history = [batch(1, 9, grpo=grpo), batch(2, 9, grpo=grpo)]
        result = results(batch(3, 9, **current), history)[name]
        assert result.verdict == verdict, result.message
        assert said in result.message
        assert result.value is not None and result.value > result.warn

    @pytest.mark.parametrize("name, current", [
        # reward up and pass@1 up with it: learning, not divergence
        ("proxy_gold_divergence", dict(pass_rate=0.8, pass_at_1=0.7)),
        # surface components up and the task's up too
        ("format_only_wins", dict(surface_fail=1.0, pass_rate=0.8)),
        # passed samples longer, failed ones not
        ("length_inflation", dict(fail_extra=0)),
        # a timeout here and there, as before
        ("anomaly_rates", dict(timeout_rate=0.01)),
        # an episode that loses a pass now and then
        ("episode_gaming", dict(episodes=True, lost_rate=0.01)),
    ])
    def test_near_misses_stay_ok(self, name, current):
        history = [batch(1, 9), batch(2, 9)]
        result = results(batch(3, 9, **current), history)[name]
        assert result.verdict == "ok", result.message

    def test_verifier_change_fails_where_params_say_so(self):
        found = results(batch(2, verifier={"code": "code-v2"}), [batch(1)],
                        thresholds={"verifier_shift": {"warn": 0.0, "fail": 0.5}})
        assert found["verifier_shift"].verdict == "fail" and found["verifier_shift"].fail == 0.5
        assert found["verifier_shift"].figures["code.changed"] == 1.0
        assert found["verifier_shift"].figures["extract.changed"] == 0.0

    def test_reward_shift_fails_where_params_say_so(self):
        found = results(batch(3, 9, pass_rate=0.95), [batch(1, 9), batch(2, 9)],
                        thresholds={"reward_shift": {"warn": 0.1, "fail": 0.25}})
        assert found["reward_shift"].verdict == "fail" and found["reward_shift"].value > 0.25

    def test_canary_names_the_envs_and_versions(self):
        before = batch(1)
        now = batch(2, verifier={"code": "code-v2"}, canary_changes=1)
        result = results(now, [before])["canary"]
        assert "code 1 (verifier code-v1 -> code-v2)" in result.message
        assert result.figures == {"compared": 16.0, "unmatched": 0.0, "code.changed": 1.0}

    def test_canary_skipped_without_a_previous_canary(self):
        before = batch(1)
        before = IterationData(1, before.experiment, before.samples, before.rewards, canary=[])
        assert results(batch(2), [before])["canary"].message == "no previous canary check to compare with"

    def test_an_unknown_status_with_limit_in_its_name_is_an_anomaly(self):
        now = batch(2)
        for row in now.rewards[:30]:
            row["status"] = "process_limit"  # a limit the sandbox names later
        result = results(now, [batch(1)])["anomaly_rates"]
        assert result.verdict == "fail" and "process_limit" in result.message
        for row in now.rewards[:30]:
            row["status"] = "format_error"  # an environment's own judged status is no anomaly
        assert results(now, [batch(1)])["anomaly_rates"].verdict == "ok"


class TestResults:
    def test_report_lists_failing_and_holding(self):
        found = run_monitors(batch(2, timeout_rate=0.3, canary_changes=1), [batch(1)], MonitorsParams())
        out = report(2, found, ["canary", "grpo_health"])
        assert {"anomaly_rates", "canary"} <= set(out["failing"])
        assert out["holding"] == ["canary"]
        assert out["monitors"][0]["name"] == "reward_shift"

    def test_numbers_are_numbers_only(self):
        found = run_monitors(batch(2), [batch(1)], MonitorsParams())
        flat = numbers(found)
        assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat.values())
        assert flat["canary.verdict_code"] == VERDICT_CODES["ok"] and flat["canary.value"] == 0
        assert flat["grpo_health.verdict_code"] == -1 and "grpo_health.value" not in flat

    def test_registry_is_the_config_s_list_and_versioned(self):
        assert tuple(m.name for m in MONITORS) == MONITOR_NAMES
        assert WARN_ONLY_MONITORS == tuple(m.name for m in MONITORS if m.default.fail is None)
        assert all(m.version for m in MONITORS)

    def test_fast_on_a_default_sized_batch(self):
        # the default run: 800 tasks x 8 samples; four iterations' batches
        big = [batch(i, tasks=800, k=4, grpo=True) for i in range(1, 5)]
        started = time.perf_counter()
        run_monitors(big[-1], big[:-1], MonitorsParams())
        assert time.perf_counter() - started < 1.0


class TestStats:
    def test_ks(self):
        assert ks_statistic([1, 2, 3], [1, 2, 3]) == 0  # identical
        assert ks_statistic([1, 2, 3], [4, 5]) == 1  # disjoint
        assert ks_statistic([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5  # half the mass moved past
        assert ks_critical(100, 100) == pytest.approx(1.63 * math.sqrt(0.02))

    def test_psi_by_hand(self):
        # 50/50 against 25/75: (0.25-0.5)ln(0.5) + (0.75-0.5)ln(1.5)
        assert psi_from_counts([50, 50], [25, 75], smoothing=0) == pytest.approx(
            0.25 * math.log(2) + 0.25 * math.log(1.5))
        assert psi_from_counts([10, 0], [10, 0]) == 0  # an empty bin on both sides: smoothed, no shift
        assert psi_from_counts([10, 0], [0, 10]) > 2  # everything moved; finite thanks to smoothing
        assert psi([0.0] * 8, [0.0] * 8) == 0  # one value on both sides
        assert psi([0, 0, 1, 1] * 5, [0, 1, 1, 1] * 5, bins=2) == pytest.approx(
            psi_from_counts([10, 10], [5, 15]))

    def test_correlations(self):
        assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1)
        assert pearson([1, 1, 1], [1, 2, 3]) is None  # constant: undefined, not 0
        assert ranks([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]
        assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1)  # monotone, not linear

    def test_significance(self):
        assert mean_rise_z([1, 1], [1, 1]) == 0
        assert mean_rise_z([2, 2], [1, 1]) == math.inf
        assert proportion_rise_z(30, 100, 0, 100) > 5
        assert proportion_rise_z(1, 4, 0, 4) < 2  # one timeout in four samples is not a burst


class TestConfig:
    @pytest.mark.parametrize("monitors, named", [
        ({"block_promotion": ["canary", "canry"]}, "monitors.block_promotion"),  # a typo would never hold
        ({"thresholds": {"reward_drift": {"warn": 0.1}}}, "monitors.thresholds"),
        ({"thresholds": {"canary": {"warn": 1, "fail": 0}}}, "monitors.thresholds.canary"),  # fail below warn
        ({"thresholds": {"canary": {"fail": 1}}}, "monitors.thresholds.canary.warn"),  # warn is required
        ({"history": -1}, "monitors.history"),
    ])
    def test_rejects_with_the_key_named(self, monitors, named):
        with pytest.raises(ConfigError) as error:
            parse_params({"monitors": monitors})
        assert named in str(error.value)

    def test_defaults(self):
        params = parse_params({"monitors": {"block_promotion": ["canary"]}})
        assert params.monitors.block_promotion == ["canary"] and params.monitors.enabled
        assert params.monitors.history == 3 and params.monitors.canary_per_env == 4
