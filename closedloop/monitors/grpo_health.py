"""grpo_health: is group-relative training getting a signal, and is the policy collapsing?

Four figures, where logged:
- zero_variance_share: the groups (a task's k samples) whose rewards are all equal. GRPO's advantage
  is 0 for every member of such a group: it learns nothing from it.
- entropy: the mean surprisal of the sampled tokens (mean of -logprob in rollouts.jsonl), an
  estimate of the policy's token entropy; entropy_drop is its fall relative to the previous iteration
  (entropy collapsing early is how RL stops exploring, Cui et al. 2025).
- clip_fraction: the completion tokens whose policy ratio left the clip range (metrics/train.json).
- logprob_delta_mean / _max: the gap between the sampler's and the trainer's log-probs of the same
  tokens (metrics/train.json; only when the sampler gave log-probs). Reported, not judged: its scale
  depends on the backend.
- The trainer's own figures over its steps (TRAINER_FIGURES: clip shares low and high, KL to the
  sampling policy, the policy's token entropy, advantages, gradient norm, completion length and the
  share cut at max_new_tokens). Reported, not judged.
The value is the largest of zero_variance_share, entropy_drop and clip_fraction: each is a share of
the batch's signal gone.
"""

from __future__ import annotations

from collections import defaultdict

from closedloop.monitors.base import IterationData, MonitorResult, Threshold, judged, skipped
from closedloop.monitors.rows import fmt, scored

# Reported beside the judged parts, as the train stage measured them (stages/train.py, training/grpo.py):
# what TRL and verl log for GRPO, over the iteration's steps.
TRAINER_FIGURES = ("frac_reward_zero_std", "advantage_mean", "advantage_std", "clip_low", "clip_high", "kl_mean",
                   "kl_last", "entropy_mean", "entropy_first", "entropy_last", "grad_norm_mean", "grad_norm_max",
                   "completion_length_mean", "truncated_share")

NAME = "grpo_health"
VERSION = "1"
DEFAULT = Threshold(warn=0.5, fail=0.8)


def is_grpo(data: IterationData) -> bool:
    # metrics/train.json holds numbers only: grpo mode is the one that reports a clip fraction
    return data.train.get("mode") == "grpo" or "clip_fraction" in data.train


def zero_variance_share(rows: list[dict]) -> tuple[float, int] | None:
    by_task: dict[str, list[float]] = defaultdict(list)
    for row in scored(rows):
        if row.get("reward") is not None:
            by_task[str(row.get("task_id"))].append(float(row["reward"]))
    sizes = [rewards for rewards in by_task.values() if len(rewards) >= 2]
    if not sizes:
        return None
    flat = sum(1 for rewards in sizes if max(rewards) - min(rewards) <= 1e-9)
    return flat / len(sizes), len(sizes)


def entropy(rollouts: list[dict]) -> float | None:
    total, count = 0.0, 0
    for row in rollouts:
        for logprob in row.get("logprobs") or ():
            total -= logprob
            count += 1
    return total / count if count else None


def check(current: IterationData, history: list[IterationData], threshold: Threshold) -> MonitorResult:
    if not is_grpo(current):
        return skipped(NAME, VERSION, threshold, "not a grpo iteration (metrics/train.json has no clip_fraction)")
    figures: dict[str, float] = {}
    judged_parts: dict[str, float] = {}
    notes = []
    zero = zero_variance_share(current.rewards)
    if zero is None:
        notes.append("no group of 2 or more samples")
    else:
        judged_parts["zero_variance_share"], figures["groups"] = zero[0], zero[1]
    now = entropy(current.rollouts)
    if now is None:
        notes.append("no sampler log-probs for the entropy")
    else:
        figures["entropy"] = now
        before = entropy(history[-1].rollouts) if history else None
        if before:
            judged_parts["entropy_drop"] = 1 - now / before
        else:
            notes.append("no previous entropy to compare with")
    if current.train.get("clip_fraction") is not None:
        judged_parts["clip_fraction"] = float(current.train["clip_fraction"])
    for key in ("logprob_delta_mean", "logprob_delta_max", *TRAINER_FIGURES):
        if current.train.get(key) is not None:
            figures[key] = float(current.train[key])
    figures.update(judged_parts)
    figures = {key: round(value, 6) for key, value in figures.items()}
    if not judged_parts:
        return skipped(NAME, VERSION, threshold, f"nothing to judge: {'; '.join(notes)}", figures)
    part, value = max(judged_parts.items(), key=lambda item: item[1])
    said = ", ".join(f"{key} {fmt(number)}" for key, number in judged_parts.items())
    return judged(NAME, VERSION, value, threshold, figures,
                  f"grpo health: {said}" + (f" ({'; '.join(notes)})" if notes else "") + f"; worst {part}")
