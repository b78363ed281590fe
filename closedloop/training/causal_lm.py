"""Supervised fine-tuning of a causal LM on (prompt, completion) pairs, with loss on the completion only.

Used by the warm start (reference solutions) and by rejection-sampling fine-tuning (verified
samples). Deterministic on CPU: the same model, examples and seed give the same weights.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from closedloop.training.batching import IGNORE_INDEX, Row, batch_indices, packed_batch, packing_agrees, padded_batch
from closedloop.training.optimization import RunSettings, optimize


@dataclass(frozen=True)
class Example:
    prompt: str
    completion: str


@dataclass
class TrainStats:
    steps: int
    examples: int
    tokens: int  # non-pad tokens fed to the model, prompt tokens included
    positions: int  # token positions computed, padding included: tokens / positions is the useful share
    wall_s: float
    tokens_per_s: float
    first_loss: float | None
    final_loss: float | None  # the last step's loss; ``losses`` has every step for smoothing
    losses: list[float] = field(default_factory=list)
    packed: bool = False  # several examples shared a row (attention kept apart), see batching.packed_batch
    bf16: bool = False  # the forwards ran under bfloat16 autocast (train.mixed_precision)

    @property
    def padding_share(self) -> float:
        return 1.0 - self.tokens / self.positions if self.positions else 0.0


def encode_example(tokenizer: Any, example: Example,
                   encode_prompt: Callable[[str], list[int]] | None = None) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one example; prompt positions carry IGNORE_INDEX.

    Prompt and completion are tokenised separately, exactly as at sampling time (where the prompt is
    tokenised with BOS and the model continues it), so training sees the token boundary it will see
    when generating. EOS ends the completion: it is how the model learns to stop.

    ``encode_prompt`` turns a prompt into the token ids the model is sampled on (a chat template, for
    instance); by default the tokenizer with its special tokens (BOS).
    """
    prompt_ids = list(encode_prompt(example.prompt)) if encode_prompt else raw_prompt_ids(tokenizer, example.prompt)
    completion_ids = tokenizer(example.completion, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; completions could not end")
    input_ids = prompt_ids + completion_ids + [eos]
    labels = [IGNORE_INDEX] * len(prompt_ids) + completion_ids + [eos]
    return input_ids, labels


def raw_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """A raw prompt as sampling tokenises it: the tokenizer's own special tokens (BOS) included."""
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def train_causal_lm(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    pack: bool = True,
    bf16: bool = False,
    **run_settings: Any,
) -> TrainStats:
    """Train ``model`` in place for ``steps`` AdamW steps; returns what happened. Leaves it in eval mode.

    ``run_settings``: the keywords of optimization.RunSettings (``seed`` required; ``progress``,
    ``checkpoint``, ``micro_batch_size``, ``gradient_checkpointing``, ``encode_prompt``), the same for
    every trainer.

    Batches walk through the examples in an order reshuffled every epoch by ``random.Random(seed)``.
    The learning rate rises linearly over ``warmup_steps`` then follows a cosine to ~0 at ``steps``.

    With ``checkpoint``, the whole state (weights, optimizer, schedule, RNG, step, losses) is saved
    every ``checkpoint.every`` steps, and a run that finds a checkpoint of itself continues from it:
    the batches are a pure function of the seed, so the result equals an uninterrupted run's. The
    checkpoint is removed once training completes.

    With ``pack`` (the default), each batch's examples are packed into as few rows as fit the batch's
    longest example, each example with positions from 0 and attention that never crosses into its
    neighbours (see batching.packed_batch): the same batch, the same loss up to float rounding, with
    far fewer padded positions computed. A model whose attention does not honour packed positions is
    detected on the first batch (the packed loss differs from the padded one) and trained padded instead.

    With ``bf16``, each forward runs under bfloat16 autocast (see :func:`use_bf16`): a different rounding
    of every step, and on a CPU with AVX512-BF16 1.16x the tokens per second over a whole warm start at
    nearly four times the peak memory (docs/benchmarks.md). The packing check stays in float32.
    """
    run = RunSettings.of("train_causal_lm", run_settings)
    if steps < 0 or batch_size < 1 or lr <= 0 or warmup_steps < 0:
        raise ValueError(
            f"steps ({steps}) must be >= 0, batch_size ({batch_size}) >= 1, lr ({lr}) > 0 and "
            f"warmup_steps ({warmup_steps}) >= 0"
        )
    if steps == 0 or not examples:
        return TrainStats(steps=0, examples=len(examples), tokens=0, positions=0, wall_s=0.0, tokens_per_s=0.0,
                          first_loss=None, final_loss=None, losses=[])

    encoded = encode_examples(model, tokenizer, examples, run.encode_prompt)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = batch_indices(len(encoded), batch_size, steps, random.Random(run.seed),
                            lengths=[len(ids) for ids, _ in encoded])

    # Tokens each example contributes to the loss: labelled positions after the first (position t
    # predicts token t + 1, so the first label is never a target).
    loss_tokens = [sum(1 for label in labels[1:] if label != IGNORE_INDEX) for _, labels in encoded]
    step_loss = SupervisedLoss(model, encoded, pad_id, pack=pack, bf16=bf16)

    started = time.perf_counter()
    losses, tokens = optimize(model, batches, step_loss, lr=lr, warmup_steps=warmup_steps, run=run,
                              loss_tokens=lambda indices: sum(loss_tokens[i] for i in indices))
    wall = time.perf_counter() - started
    return TrainStats(steps=len(losses), examples=len(examples), tokens=tokens, positions=step_loss.positions,
                      wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else 0.0, first_loss=losses[0],
                      final_loss=losses[-1], losses=losses, packed=bool(step_loss.packing), bf16=bf16)


def encode_examples(model: Any, tokenizer: Any, examples: list[Example],
                    encode_prompt: Callable[[str], list[int]] | None = None) -> list[Row]:
    """Every example encoded (:func:`encode_example`), cut to the model's context."""
    limit = getattr(model.config, "max_position_embeddings", None)
    encoded = [encode_example(tokenizer, example, encode_prompt) for example in examples]
    if limit:
        # Keep the prompt and as much of the completion as fits; the tail is what gets cut.
        encoded = [(ids[:limit], labels[:limit]) for ids, labels in encoded]
    return encoded


class SupervisedLoss:
    """``step_loss`` of :func:`optimize` for encoded examples: the model's causal-LM loss on a batch,
    packed where the model honours packed positions, else padded.

    Whether packing is used is decided on the first batch in which examples share a row (``packing``
    None until then; False from the start without ``pack``). ``positions`` counts the token positions
    computed, padding included."""

    def __init__(self, model: Any, encoded: list[Row], pad_id: int, *, pack: bool, bf16: bool) -> None:
        self.model, self.encoded, self.pad_id, self.bf16 = model, encoded, pad_id, bf16
        self.packing: bool | None = None if pack else False
        self.positions = 0

    def __call__(self, indices: list[int], denominator: int | None) -> tuple[Any, int]:
        model = self.model
        rows = [self.encoded[i] for i in indices]
        inputs = packed_batch(rows, self.pad_id) if self.packing is not False else None
        if inputs is not None and len(inputs["input_ids"]) == len(rows):
            inputs = None  # nothing shares a row: padding is the same batch, and tells nothing about the model
        if inputs is not None and self.packing is None:
            self.packing = packing_agrees(model, padded_batch(rows, self.pad_id), inputs)
        if inputs is None or not self.packing:
            inputs = padded_batch(rows, self.pad_id)
        inputs = {name: t.to(model.device) for name, t in inputs.items()}
        self.positions += inputs["input_ids"].numel()
        # The batch's own token mean, or (a micro-batch) its token sum over the whole batch's count.
        extra = {} if denominator is None else {"num_items_in_batch": denominator}
        with _autocast(model, self.bf16):
            loss = model(**inputs, use_cache=False, **extra).loss
        return loss, sum(len(ids) for ids, _ in rows)


def use_bf16(setting: str, model: Any) -> bool:
    """Whether ``train.mixed_precision`` (auto / bf16 / fp32) trains ``model`` in bfloat16 autocast: auto
    only where its device computes bfloat16 natively; elsewhere autocast emulates it, slower than float32."""
    import torch

    if setting != "auto":
        return setting == "bf16"
    if model.device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if model.device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # oneDNN's check: AVX512-BF16 or AMX
    return False


def _autocast(model: Any, bf16: bool) -> Any:
    """Mixed precision: the forward's matrix products in bfloat16, weights, gradients and optimizer
    state in float32 (torch.autocast), or nothing when ``bf16`` is off."""
    import torch

    if not bf16:
        return nullcontext()
    return torch.autocast(model.device.type, dtype=torch.bfloat16)
