"""What a grpo run reports: the figures TRL's and verl's GRPO trainers log, per step and over the run
(training/grpo.py fills them), and several runs (on-policy rounds) combined as one."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class GrpoStats:
    steps: int
    rollouts: int  # rollouts trained on (those in groups with reward spread)
    groups: int
    skipped_groups: int  # groups with zero reward spread
    tokens: int
    wall_s: float
    tokens_per_s: float
    first_loss: float | None
    final_loss: float | None
    clip_fraction: float  # completion tokens whose ratio left [1 - clip, 1 + clip]
    initial_log_ratio: float  # max |log ratio| on the first batch: ~0 when tokens and logprobs align
    losses: list[float] = field(default_factory=list)
    # Where the behaviour log-probabilities came from: "sampler" (every rollout carried them),
    # "trainer" (none did: computed under the champion before any update), "mixed", or "" (no rows).
    behaviour_logprobs: str = ""
    # |sampler - trainer| log-probability over every completion token whose sampler value exists
    # (None when none does): the sampler/trainer consistency check.
    logprob_delta_mean: float | None = None
    logprob_delta_max: float | None = None
    # Before any update: the share of groups with no reward spread (TRL's frac_reward_zero_std), the
    # trained rollouts' advantages and completion lengths (the model's own tokens).
    zero_std_share: float = 0.0
    advantage_mean: float = 0.0
    advantage_std: float = 0.0
    completion_length_mean: float = 0.0
    # One record per step: step, loss, lr, grad_norm, clip_low, clip_high, kl, entropy (see optimize).
    steps_log: list[dict[str, float]] = field(default_factory=list)
    # Episodes: the earlier attempts' tokens trained with the final ones, and the transcript tokens
    # between them (task, feedback) that were context only.
    earlier_attempt_tokens: int = 0
    feedback_tokens: int = 0

    def run_figures(self) -> dict[str, float | None]:
        """The per-step figures over the run: means, the first and last step's entropy and KL, the
        largest gradient norm. Empty figures (None) when nothing trained."""
        log = self.steps_log

        def mean(key: str) -> float | None:
            return round(statistics.fmean(r[key] for r in log), 6) if log else None

        return {"clip_low": mean("clip_low"), "clip_high": mean("clip_high"), "kl_mean": mean("kl"),
                "kl_last": round(log[-1]["kl"], 6) if log else None,
                "entropy_mean": mean("entropy"), "entropy_first": round(log[0]["entropy"], 6) if log else None,
                "entropy_last": round(log[-1]["entropy"], 6) if log else None,
                "grad_norm_mean": mean("grad_norm"), "grad_norm_max": round(max(r["grad_norm"] for r in log), 6) if log else None,
                "lr_max": max(r["lr"] for r in log) if log else None}


def combine_stats(parts: list[GrpoStats]) -> GrpoStats:
    """Several grpo runs one after another (on-policy rounds) as one: counts and tokens add up, the step
    log runs on (steps numbered across runs), shares and means are weighted by what they are shares of
    (groups, trained rollouts, clipped tokens by tokens)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        raise ValueError("no grpo runs to combine")

    def weighted(key: str, weight: str) -> float:
        total = sum(getattr(p, weight) for p in parts)
        return sum(getattr(p, key) * getattr(p, weight) for p in parts) / total if total else 0.0

    log, offset = [], 0
    for part in parts:
        log += [{**record, "step": record["step"] + offset} for record in part.steps_log]
        offset += part.steps
    losses = [loss for part in parts for loss in part.losses]
    deltas = [p for p in parts if p.logprob_delta_mean is not None]
    sources = {p.behaviour_logprobs for p in parts if p.behaviour_logprobs}
    wall = sum(p.wall_s for p in parts)
    tokens = sum(p.tokens for p in parts)
    return GrpoStats(
        steps=sum(p.steps for p in parts), rollouts=sum(p.rollouts for p in parts),
        groups=sum(p.groups for p in parts), skipped_groups=sum(p.skipped_groups for p in parts), tokens=tokens,
        wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else 0.0,
        first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None,
        clip_fraction=weighted("clip_fraction", "tokens"),
        initial_log_ratio=max(p.initial_log_ratio for p in parts), losses=losses,
        behaviour_logprobs=sources.pop() if len(sources) == 1 else "mixed" if sources else "",
        logprob_delta_mean=(sum(p.logprob_delta_mean * p.rollouts for p in deltas) / max(1, sum(p.rollouts for p in deltas))
                            if deltas else None),
        logprob_delta_max=max(p.logprob_delta_max for p in deltas) if deltas else None,
        zero_std_share=weighted("zero_std_share", "groups"), advantage_mean=weighted("advantage_mean", "rollouts"),
        advantage_std=weighted("advantage_std", "rollouts"),
        completion_length_mean=weighted("completion_length_mean", "rollouts"), steps_log=log,
        earlier_attempt_tokens=sum(p.earlier_attempt_tokens for p in parts),
        feedback_tokens=sum(p.feedback_tokens for p in parts),
    )
