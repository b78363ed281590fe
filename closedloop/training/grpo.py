"""Group-relative policy optimisation on a batch of k samples per task, offline.

The sample stage drew the batch from the champion and recorded each completion's tokens and, where
the sampling backend returns them, their log-probabilities; this trains on exactly those tokens.
Before any update a no-grad pass of the model (which is the champion then) computes every
completion token's log-probability: it stands in for the behaviour log-probabilities a backend did
not return, and where the backend did return them, the differences are reported (they should be
rounding noise; anything larger means the sampler and the trainer see different tokens, prompts or
temperatures). Training runs with dropout off, so the trainer's forward is the sampler's.
Each task's samples form a group: a
sample's advantage is its (shaped) reward minus the group's mean, over the group's standard
deviation, so the update moves toward what beat the other attempts at the same task. A group whose
rewards are all equal carries no signal and is skipped (and counted). The loss is the clipped
policy-ratio objective against the recorded sampling log-probabilities, averaged over completion
tokens (DAPO's token-level mean, so long completions are not down-weighted), with an optional k3
KL penalty toward the sampling policy.

What TRL's and verl's GRPO trainers log is logged here too, per step (``GrpoStats.steps_log``) and
over the run: the share of groups with no reward spread, the advantages' mean and spread, the clip
shares (low: ratio below 1 - clip on a negative advantage; high: above 1 + clip on a positive one, the
regions where clipping stops the gradient), the k3 KL to the sampling policy, the policy's token
entropy over completion tokens, completion length, gradient norm and learning rate. None of it changes
what a step computes.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from closedloop.training.batching import batch_indices
from closedloop.training.causal_lm import raw_prompt_ids
from closedloop.training.grpo_stats import GrpoStats
from closedloop.training.optimization import Carry, RunSettings, optimize

ZERO_SPREAD = 1e-6  # a group whose reward standard deviation is below this gives no gradient
LOSSES = ("dapo", "grpo", "dr_grpo")  # as TRL's GRPOConfig.loss_type names them


@dataclass(frozen=True)
class Transcript:
    """An episode's earlier rounds, trained with its final attempt as one sequence: the token ids of the
    transcript the final attempt was sampled on, the spans [start, end) of them that are the model's own
    earlier attempts, and each span's sampling log-probabilities (None: the trainer computes them)."""

    prompt_ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    span_logprobs: tuple[tuple[float, ...] | None, ...]


@dataclass(frozen=True)
class Rollout:
    group: str  # the task the sample answers: advantages are relative within it
    prompt: str
    token_ids: tuple[int, ...]  # the completion tokens as sampled (EOS / stop token included)
    # Their log-probabilities under the sampling policy (logits / temperature); None when the backend
    # returned none: the trainer computes them under the champion.
    logprobs: tuple[float, ...] | None
    reward: float
    # A multi-round episode: the transcript its final attempt was sampled on (``prompt`` is then unused).
    # The trained sequence runs from the first attempt to the end of the final one; only the model's own
    # tokens (every attempt's) carry the loss, the feedback between them is context.
    transcript: Transcript | None = None


@dataclass(frozen=True)
class GrpoRow:
    """One trained rollout: the context, then the tokens the loss runs over (``model``: which of them are
    the model's own; None: all), their behaviour log-probabilities (None entries, or None: the trainer's),
    and the rollout's advantage."""

    prompt: list[int]
    completion: list[int]
    logprobs: list[float | None] | None
    advantage: float
    model: list[int] | None = None
    earlier: int = 0  # of the model's tokens, those of an episode's earlier attempts

    @property
    def model_tokens(self) -> int:
        return len(self.completion) if self.model is None else sum(self.model)


def group_advantages(rewards: list[float], *, scale: bool = True, negative_weight: float = 1.0) -> list[float] | None:
    """(r - mean) / std within one group; None when the rewards have (almost) no spread.

    ``scale=False`` leaves out the division by the standard deviation (Dr. GRPO: groups that are
    nearly all-pass or all-fail then weigh less). ``negative_weight`` scales the below-mean
    advantages: pushing down a failed sample's tokens also pushes down tokens it shares with the
    successes, and spreads the probability it frees over everything else.
    """
    if len(rewards) < 2:
        return None
    spread = statistics.pstdev(rewards)
    if spread < ZERO_SPREAD:
        return None
    mean = statistics.fmean(rewards)
    advantages = [(r - mean) / (spread if scale else 1.0) for r in rewards]
    return [a if a >= 0 else a * negative_weight for a in advantages]


def train_grpo(
    model: Any,
    tokenizer: Any,
    rollouts: list[Rollout],
    *,
    epochs: float,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    clip: float,
    beta: float,
    temperature: float,
    scale_advantages: bool = True,
    negative_weight: float = 1.0,
    loss: str = "dapo",
    clip_high: float | None = None,
    max_completion_length: int | None = None,
    carry: Carry | None = None,
    **run_settings: Any,
) -> GrpoStats:
    """Train ``model`` in place; ``ceil(epochs * usable rollouts / batch_size)`` steps.

    ``model`` must be the policy that sampled the rollouts (the champion), untrained since: rollouts
    without log-probabilities get them from it.

    ``loss`` is how the per-token objective becomes the batch's loss, as TRL names it: ``dapo`` the mean
    over every completion token of the batch (long completions weigh by their length), ``grpo`` each
    completion's token mean, then the mean over completions (the original GRPO; short completions
    weigh more per token), ``dr_grpo`` the token sum over completions x ``max_completion_length`` (Dr.
    GRPO: no length normalisation). ``clip_high`` is DAPO's clip-higher: the ratio's upper bound is
    1 + clip_high (None: 1 + clip), so rare tokens of a better completion can gain more than clip allows.
    ``carry``: the optimizer and schedule of earlier runs to go on with (on-policy rounds; see optimize).
    ``run_settings``: the keywords of optimization.RunSettings (``seed`` required), as train_causal_lm.
    """
    run = RunSettings.of("train_grpo", run_settings)
    _check_settings(temperature, loss, max_completion_length)
    groups: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        groups.setdefault(rollout.group, []).append(rollout)
    rows, skipped = _advantage_rows(groups, tokenizer, scale_advantages, negative_weight, run.encode_prompt)
    rows = _fit_context(rows, getattr(model.config, "max_position_embeddings", None))
    steps = math.ceil(epochs * len(rows) / batch_size) if rows else 0
    batch_figures = _batch_figures(rows, skipped, len(groups))
    if steps == 0:
        return GrpoStats(steps=0, rollouts=len(rows), groups=len(groups), skipped_groups=skipped, tokens=0,
                         wall_s=0.0, tokens_per_s=0.0, first_loss=None, final_loss=None, clip_fraction=0.0,
                         initial_log_ratio=0.0, losses=[], **batch_figures)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    started = time.perf_counter()
    rows, behaviour = _behaviour_logprobs(model, rows, temperature=temperature,
                                          batch_size=run.micro_batch_size or batch_size, pad_id=pad_id)
    batches = batch_indices(len(rows), batch_size, steps, random.Random(run.seed),
                            lengths=[len(row.prompt) + len(row.completion) for row in rows])
    step_loss = GrpoLoss(model, rows, pad_id, temperature=temperature, clip=clip,
                         upper=clip if clip_high is None else clip_high, beta=beta, loss=loss,
                         max_completion_length=max_completion_length)
    steps_log: list[dict[str, float]] = []
    losses, tokens = optimize(model, batches, step_loss, lr=lr, warmup_steps=warmup_steps, run=run,
                              loss_tokens=(lambda indices: sum(rows[i].model_tokens for i in indices))
                              if loss == "dapo" else len, dropout=False,
                              log=steps_log, step_figures=step_loss.step_figures, carry=carry)
    wall = time.perf_counter() - started
    return GrpoStats(
        steps=len(losses), rollouts=len(rows), groups=len(groups), skipped_groups=skipped, tokens=tokens,
        wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else 0.0,
        first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None,
        clip_fraction=step_loss.clipped / step_loss.counted if step_loss.counted else 0.0,
        initial_log_ratio=step_loss.initial[0] if step_loss.initial else 0.0, losses=losses,
        steps_log=steps_log, **behaviour, **batch_figures,
    )


def _check_settings(temperature: float, loss: str, max_completion_length: int | None) -> None:
    if temperature <= 0:
        raise ValueError("grpo needs sampled rollouts (temperature > 0): greedy groups have no spread")
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: expected one of {', '.join(LOSSES)}")
    if loss == "dr_grpo" and not max_completion_length:
        raise ValueError("loss dr_grpo divides by max_completion_length (sample.max_new_tokens); none given")


def _advantage_rows(groups: dict[str, list[Rollout]], tokenizer: Any, scale_advantages: bool,
                    negative_weight: float,
                    encode_prompt: Callable[[str], list[int]] | None) -> tuple[list[GrpoRow], int]:
    """The rollouts of every group with a reward spread, each with its advantage, groups in name order
    (empty completions left out); and how many groups had no spread."""
    rows: list[GrpoRow] = []
    skipped = 0
    prompt_ids_of: dict[str, list[int]] = {}
    for name in sorted(groups):
        members = groups[name]
        advantages = group_advantages([r.reward for r in members], scale=scale_advantages,
                                      negative_weight=negative_weight)
        if advantages is None:
            skipped += 1
            continue
        for rollout, advantage in zip(members, advantages):
            if not rollout.token_ids:
                continue
            if rollout.logprobs is not None and len(rollout.token_ids) != len(rollout.logprobs):
                raise ValueError(f"rollout of {name!r}: {len(rollout.token_ids)} tokens but "
                                 f"{len(rollout.logprobs)} log-probabilities")
            if rollout.prompt not in prompt_ids_of:
                prompt_ids_of[rollout.prompt] = (list(encode_prompt(rollout.prompt)) if encode_prompt
                                                 else raw_prompt_ids(tokenizer, rollout.prompt))
            if rollout.transcript is not None:
                rows.append(_episode_row(rollout, advantage, name))
                continue
            logprobs = None if rollout.logprobs is None else list(rollout.logprobs)
            rows.append(GrpoRow(prompt_ids_of[rollout.prompt], list(rollout.token_ids), logprobs, advantage))
    return rows, skipped


def _episode_row(rollout: Rollout, advantage: float, name: str) -> GrpoRow:
    """A multi-round episode as one row: the transcript up to its first attempt is the context; from
    there to the final attempt's end the loss covers the model's own tokens only."""
    transcript = rollout.transcript
    ids = list(transcript.prompt_ids)
    start = transcript.spans[0][0] if transcript.spans else len(ids)
    middle = len(ids) - start
    model, logprobs = [0] * middle, [None] * middle
    for (lo, hi), sampled in zip(transcript.spans, transcript.span_logprobs):
        if not start <= lo < hi <= len(ids) or (sampled is not None and len(sampled) != hi - lo):
            raise ValueError(f"rollout of {name!r}: span [{lo}, {hi}) of a {len(ids)}-token transcript "
                             f"({'no' if sampled is None else len(sampled)} log-probabilities)")
        model[lo - start:hi - start] = [1] * (hi - lo)
        if sampled is not None:
            logprobs[lo - start:hi - start] = list(sampled)
    final = list(rollout.logprobs) if rollout.logprobs is not None else [None] * len(rollout.token_ids)
    return GrpoRow(ids[:start], ids[start:] + list(rollout.token_ids), logprobs + final, advantage,
                   model + [1] * len(rollout.token_ids), earlier=sum(model))


def _fit_context(rows: list[GrpoRow], limit: int | None) -> list[GrpoRow]:
    """Keep what fits the model's context; the tail of an over-long completion is what gets cut."""
    if not limit:
        return rows

    def cut(values: list | None, room: int) -> list | None:
        return None if values is None else values[:room]

    rows = [replace(row, completion=row.completion[:room], logprobs=cut(row.logprobs, room), model=cut(row.model, room))
            for row in rows for room in [max(0, limit - len(row.prompt))]]
    return [row for row in rows if row.model_tokens]


def _batch_figures(rows: list[GrpoRow], skipped: int, groups: int) -> dict[str, float]:
    """Before any update: the share of groups without spread, the advantages and completion lengths."""
    advantages = [row.advantage for row in rows]
    episodes = [row for row in rows if row.model is not None]
    return {
        "zero_std_share": skipped / groups if groups else 0.0,
        "advantage_mean": statistics.fmean(advantages) if advantages else 0.0,
        "advantage_std": statistics.pstdev(advantages) if advantages else 0.0,
        "completion_length_mean": statistics.fmean(row.model_tokens for row in rows) if rows else 0.0,
        **({"earlier_attempt_tokens": sum(row.earlier for row in episodes),
            "feedback_tokens": sum(len(row.completion) - row.model_tokens for row in episodes)} if episodes else {}),
    }


def _behaviour_logprobs(model: Any, rows: list[GrpoRow], *, temperature: float, batch_size: int,
                        pad_id: int) -> tuple[list[GrpoRow], dict[str, Any]]:
    """Every row with its behaviour log-probabilities (the sampler's, or the champion's own where the
    sampler gave none), and the GrpoStats figures of where they came from and how far apart they are."""
    # Before any update: the champion's own log-probabilities of every completion token.
    trainer_logprobs = policy_logprobs(model, [(row.prompt, row.completion) for row in rows], temperature=temperature,
                                       batch_size=batch_size, pad_id=pad_id)
    # Only the model's own tokens carry the loss: an episode's feedback tokens have no behaviour figure.
    sampled_of = [[None if row.logprobs is None or (row.model is not None and not row.model[i]) else row.logprobs[i]
                   for i in range(len(row.completion))] for row in rows]
    deltas = [abs(s - t) for sampled, computed in zip(sampled_of, trainer_logprobs)
              for s, t in zip(sampled, computed) if s is not None]
    wanted = [sum(1 for i in range(len(row.completion)) if row.model is None or row.model[i]) for row in rows]
    given = [sum(value is not None for value in sampled) for sampled in sampled_of]
    source = ("sampler" if given == wanted else "trainer" if not any(given) else "mixed")
    rows = [replace(row, logprobs=[t if s is None else s for s, t in zip(sampled, computed)])
            for row, sampled, computed in zip(rows, sampled_of, trainer_logprobs)]
    return rows, {"behaviour_logprobs": source,
                  "logprob_delta_mean": sum(deltas) / len(deltas) if deltas else None,
                  "logprob_delta_max": max(deltas) if deltas else None}


class GrpoLoss:
    """``step_loss`` of optimization.optimize for grpo rows: the clipped policy-ratio objective (with the
    k3 KL penalty when ``beta``), reduced as ``loss`` says; it counts the clipped tokens, and sums
    each step's clip shares, KL and entropy for the step log (:meth:`step_figures`)."""

    def __init__(self, model: Any, rows: list[GrpoRow], pad_id: int, *, temperature: float, clip: float,
                 upper: float, beta: float, loss: str, max_completion_length: int | None) -> None:
        self.model, self.rows, self.pad_id, self.temperature = model, rows, pad_id, temperature
        self.clip, self.upper, self.beta, self.loss, self.max_completion_length = (clip, upper, beta, loss,
                                                                                   max_completion_length)
        self.clipped = self.counted = 0
        self.initial: list[float] = []
        # This step's sums over its completion tokens (every micro-batch), for the step log.
        self.step_sums = dict.fromkeys(("tokens", "clip_low", "clip_high", "kl", "entropy"), 0.0)

    def step_figures(self) -> dict[str, float]:
        step_sums = self.step_sums
        n = step_sums["tokens"] or 1.0
        figures = {key: step_sums[key] / n for key in ("clip_low", "clip_high", "kl", "entropy")}
        step_sums.update(dict.fromkeys(step_sums, 0.0))
        return figures

    def __call__(self, indices: list[int], denominator: int | None) -> tuple[Any, int]:
        import torch

        model, clip, upper = self.model, self.clip, self.upper
        batch = [self.rows[i] for i in indices]
        input_ids, attention, mask = _pack([(row.prompt, row.completion) for row in batch], self.pad_id,
                                           model.device, [row.model for row in batch])
        old = torch.zeros(mask.shape)  # (B, T-1): position t predicts token t + 1
        for b, row in enumerate(batch):
            old[b, len(row.prompt) - 1 : len(row.prompt) + len(row.completion) - 1] = torch.tensor(row.logprobs)
        advantage = torch.tensor([row.advantage for row in batch])[:, None]  # (B, 1)
        old, advantage = old.to(model.device), advantage.to(model.device)
        logp, entropy = _token_logprobs(model, input_ids, attention, self.temperature, entropy=True)  # (B, T-1) each
        log_ratio = (logp - old) * mask
        ratio = torch.exp(log_ratio)
        objective = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip, 1 + upper) * advantage)
        per_token = -objective
        if self.beta:
            # k3 estimator of KL(policy || sampling policy): non-negative, unbiased on policy samples.
            per_token = per_token + self.beta * (torch.exp(-log_ratio) + log_ratio - 1)
        weights, count = self._weights(mask, len(batch))
        batch_loss = (per_token * weights).sum() / (count if denominator is None else denominator)
        with torch.no_grad():
            self._count(ratio, log_ratio, advantage, entropy, mask)
        return batch_loss, int(attention.sum())

    def _weights(self, mask: Any, completions: int) -> tuple[Any, Any]:
        """dapo: the batch's token mean; grpo, dr_grpo: the mean over completions of each one's token mean,
        or token sum / max_completion_length. A micro-batch divides by the whole batch's count."""
        if self.loss == "dapo":
            return mask, mask.sum()
        if self.loss == "grpo":
            return mask / mask.sum(1, keepdim=True).clamp(min=1), completions
        return mask / self.max_completion_length, completions

    def _count(self, ratio: Any, log_ratio: Any, advantage: Any, entropy: Any, mask: Any) -> None:
        import torch

        clip, upper, step_sums = self.clip, self.upper, self.step_sums
        outside = ((ratio < 1 - clip) | (ratio > 1 + upper)).float() * mask
        self.clipped += int(outside.sum())
        self.counted += int(mask.sum())
        step_sums["tokens"] += float(mask.sum())
        step_sums["clip_low"] += float((((ratio < 1 - clip) & (advantage < 0)).float() * mask).sum())
        step_sums["clip_high"] += float((((ratio > 1 + upper) & (advantage > 0)).float() * mask).sum())
        step_sums["kl"] += float(((torch.exp(-log_ratio) + log_ratio - 1) * mask).sum())
        step_sums["entropy"] += float((entropy * mask).sum())
        if not self.initial:
            self.initial.append(float(log_ratio.abs().max()))


def policy_logprobs(model: Any, rows: list[tuple[list[int], list[int]]], *, temperature: float, batch_size: int,
                    pad_id: int) -> list[list[float]]:
    """Each completion token's log-probability under ``model`` given its prompt: ``rows`` are
    (prompt ids, completion ids). No gradients, dropout off, logits / temperature as in the loss and
    as the sampler draws; the model is left in the mode it was in."""
    import torch

    was_training = model.training
    model.eval()
    out: list[list[float]] = []
    try:
        with torch.no_grad():
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                input_ids, attention, _ = _pack(chunk, pad_id, model.device)
                logp = _token_logprobs(model, input_ids, attention, temperature).cpu()
                out += [logp[b, len(p) - 1 : len(p) + len(c) - 1].tolist() for b, (p, c) in enumerate(chunk)]
    finally:
        model.train(was_training)
    return out


def _pack(rows: list[tuple[list[int], list[int]]], pad_id: int, device: Any,
          models: list[list[int] | None] | None = None) -> tuple[Any, Any, Any]:
    """Right-padded (prompt + completion) ids, their attention mask, and the mask of the positions
    that predict a completion token: (B, T), (B, T), (B, T-1). ``models``: per row, which completion
    tokens are the model's own (None: all); the others are left out of the mask (no loss, no gradient)."""
    import torch

    width = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width - 1))
    for b, (prompt, completion) in enumerate(rows):
        n = len(prompt) + len(completion)
        input_ids[b, :n] = torch.tensor(prompt + completion)
        attention[b, :n] = 1
        mask[b, len(prompt) - 1 : n - 1] = 1
        if models is not None and models[b] is not None:
            mask[b, len(prompt) - 1 : n - 1] = torch.tensor(models[b], dtype=mask.dtype)
    return input_ids.to(device), attention.to(device), mask.to(device)


def _token_logprobs(model: Any, input_ids: Any, attention: Any, temperature: float, *, entropy: bool = False) -> Any:
    """log p(token t + 1 | tokens <= t) at every position, in float32 whatever the model's dtype: (B, T-1).

    ``entropy=True`` returns (log-probs, the entropy of each position's distribution, no gradient)."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()  # (B, T-1, V)
    distribution = torch.log_softmax(logits / temperature, dim=-1)
    logprobs = distribution.gather(2, input_ids[:, 1:, None]).squeeze(-1)
    if not entropy:
        return logprobs
    with torch.no_grad():  # a row at a time: the (T, V) product, not another (B, T, V) tensor
        detached = distribution.detach()
        return logprobs, torch.stack([-(row.exp() * row).sum(-1) for row in detached])
