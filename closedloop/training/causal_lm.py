"""Supervised fine-tuning of a causal LM on (prompt, completion) pairs, with loss on the completion only.

Used by the warm start (reference solutions) and by rejection-sampling fine-tuning (verified
samples). Deterministic on CPU: the same model, examples and seed give the same weights.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from closedloop.faults import fault_point

IGNORE_INDEX = -100  # the label value transformers' causal-LM loss skips
GROUP_WINDOW = 8  # batches whose long examples are grouped together (see _batch_indices)
LONG_FACTOR = 1.5  # "long" means longer than this times the median example


@dataclass(frozen=True)
class Example:
    prompt: str
    completion: str


@dataclass(frozen=True)
class Checkpointing:
    """Where and how often training saves its whole state, and what identifies the run.

    ``identity`` names what the run is (its data, its settings, its starting model) as plain values;
    resuming from a checkpoint whose identity differs is refused, naming each difference.
    """

    directory: Any  # pathlib.Path
    every: int
    identity: dict[str, Any]


@dataclass
class Carry:
    """An optimizer and its schedule carried over several optimize calls (see optimize's ``carry``)."""

    total_steps: int  # the schedule's length over every call
    optimizer: Any = None
    scheduler: Any = None

    def state(self) -> dict[str, Any] | None:
        return None if self.optimizer is None else {"optimizer": self.optimizer.state_dict(),
                                                    "scheduler": self.scheduler.state_dict()}

    def restore(self, model: Any, lr: float, warmup_steps: int, state: dict[str, Any] | None) -> None:
        """Make the optimizer and schedule for ``model`` and load ``state`` (from :meth:`state`) into them."""
        self.optimizer, self.scheduler = _new_optimizer(model, lr, warmup_steps, self.total_steps)
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])


class ResumeRefused(RuntimeError):
    """A checkpoint exists but belongs to a different training run."""


CHECKPOINT_FILE = "state.pt"


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
    packed: bool = False  # several examples shared a row (attention kept apart), see _pack
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
    prompt_ids = list(encode_prompt(example.prompt)) if encode_prompt else _encode_prompt(tokenizer, example.prompt)
    completion_ids = tokenizer(example.completion, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; completions could not end")
    input_ids = prompt_ids + completion_ids + [eos]
    labels = [IGNORE_INDEX] * len(prompt_ids) + completion_ids + [eos]
    return input_ids, labels


def _encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
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
    seed: int,
    progress: bool = False,
    checkpoint: Checkpointing | None = None,
    micro_batch_size: int = 0,
    gradient_checkpointing: bool = False,
    encode_prompt: Callable[[str], list[int]] | None = None,
    pack: bool = True,
    bf16: bool = False,
) -> TrainStats:
    """Train ``model`` in place for ``steps`` AdamW steps; returns what happened. Leaves it in eval mode.

    ``micro_batch_size`` (0: the whole batch) and ``gradient_checkpointing`` trade time for memory
    without changing the result beyond rounding: see :func:`optimize`. ``encode_prompt``: see
    :func:`encode_example`.

    Batches walk through the examples in an order reshuffled every epoch by ``random.Random(seed)``.
    The learning rate rises linearly over ``warmup_steps`` then follows a cosine to ~0 at ``steps``.

    With ``checkpoint``, the whole state (weights, optimizer, schedule, RNG, step, losses) is saved
    every ``checkpoint.every`` steps, and a run that finds a checkpoint of itself continues from it:
    the batches are a pure function of the seed, so the result equals an uninterrupted run's. The
    checkpoint is removed once training completes.

    With ``pack`` (the default), each batch's examples are packed into as few rows as fit the batch's
    longest example, each example with positions from 0 and attention that never crosses into its
    neighbours (see :func:`_pack`): the same batch, the same loss up to float rounding, with far fewer
    padded positions computed. A model whose attention does not honour packed positions is detected
    on the first batch (the packed loss differs from the padded one) and trained padded instead.

    With ``bf16``, each forward runs under bfloat16 autocast (see :func:`use_bf16`): a different rounding
    of every step, and on a CPU with AVX512-BF16 1.16x the tokens per second over a whole warm start at
    nearly four times the peak memory (docs/benchmarks.md). The packing check stays in float32.
    """
    if steps < 0 or batch_size < 1 or lr <= 0 or warmup_steps < 0:
        raise ValueError(
            f"steps ({steps}) must be >= 0, batch_size ({batch_size}) >= 1, lr ({lr}) > 0 and "
            f"warmup_steps ({warmup_steps}) >= 0"
        )
    if steps == 0 or not examples:
        return TrainStats(steps=0, examples=len(examples), tokens=0, positions=0, wall_s=0.0, tokens_per_s=0.0,
                          first_loss=None, final_loss=None, losses=[])

    limit = getattr(model.config, "max_position_embeddings", None)
    encoded = [encode_example(tokenizer, example, encode_prompt) for example in examples]
    if limit:
        # Keep the prompt and as much of the completion as fits; the tail is what gets cut.
        encoded = [(ids[:limit], labels[:limit]) for ids, labels in encoded]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = _batch_indices(len(encoded), batch_size, steps, random.Random(seed),
                             lengths=[len(ids) for ids, _ in encoded])

    # Tokens each example contributes to the loss: labelled positions after the first (position t
    # predicts token t + 1, so the first label is never a target).
    loss_tokens = [sum(1 for label in labels[1:] if label != IGNORE_INDEX) for _, labels in encoded]

    # Whether packing is used: decided on the first batch in which examples share a row (None: not yet).
    packing: bool | None = None if pack else False
    positions = 0

    def step_loss(indices: list[int], denominator: int | None) -> tuple[Any, int]:
        nonlocal packing, positions
        rows = [encoded[i] for i in indices]
        inputs = _pack(rows, pad_id) if packing is not False else None
        if inputs is not None and len(inputs["input_ids"]) == len(rows):
            inputs = None  # nothing shares a row: padding is the same batch, and tells nothing about the model
        if inputs is not None and packing is None:
            packing = _packing_agrees(model, _padded(rows, pad_id), inputs)
        if inputs is None or not packing:
            inputs = _padded(rows, pad_id)
        inputs = {name: t.to(model.device) for name, t in inputs.items()}
        positions += inputs["input_ids"].numel()
        # The batch's own token mean, or (a micro-batch) its token sum over the whole batch's count.
        extra = {} if denominator is None else {"num_items_in_batch": denominator}
        with _autocast(model, bf16):
            loss = model(**inputs, use_cache=False, **extra).loss
        return loss, sum(len(ids) for ids, _ in rows)

    started = time.perf_counter()
    losses, tokens = optimize(model, batches, step_loss, lr=lr, warmup_steps=warmup_steps, seed=seed,
                              checkpoint=checkpoint, progress=progress, micro_batch_size=micro_batch_size,
                              loss_tokens=lambda indices: sum(loss_tokens[i] for i in indices),
                              gradient_checkpointing=gradient_checkpointing)
    wall = time.perf_counter() - started
    return TrainStats(
        steps=len(losses),
        examples=len(examples),
        tokens=tokens,
        positions=positions,
        wall_s=wall,
        tokens_per_s=tokens / wall if wall > 0 else 0.0,
        first_loss=losses[0],
        final_loss=losses[-1],
        losses=losses,
        packed=bool(packing),
        bf16=bf16,
    )


def optimize(
    model: Any,
    batches: list[list[int]],
    step_loss: Any,
    *,
    lr: float,
    warmup_steps: int,
    seed: int,
    checkpoint: Checkpointing | None = None,
    progress: bool = False,
    micro_batch_size: int = 0,
    loss_tokens: Callable[[list[int]], int] | None = None,
    gradient_checkpointing: bool = False,
    dropout: bool = True,
    log: list[dict[str, float]] | None = None,
    step_figures: Callable[[], dict[str, float]] | None = None,
    carry: "Carry | None" = None,
) -> tuple[list[float], int]:
    """One AdamW step per batch of example indices; ``step_loss(indices, denominator) -> (loss, tokens)``.

    The loop every training mode shares: warm-up then cosine schedule, gradient clipping at 1.0,
    checkpoints every ``checkpoint.every`` steps and resumption from one (see train_causal_lm).
    Returns every step's loss and the tokens fed. Leaves the model in eval mode.

    ``step_loss`` returns the batch's token-mean loss when ``denominator`` is None. With
    ``micro_batch_size`` smaller than a batch, each step runs the batch in consecutive micro-batches
    of that size and accumulates their gradients: ``step_loss(part, denominator)`` then returns the
    part's summed token losses over ``denominator = loss_tokens(batch)``, the whole batch's loss
    tokens, so the parts add up to exactly the full batch's mean (the same step, up to rounding).

    ``gradient_checkpointing`` recomputes each layer's activations in backward (transformers'
    activation checkpointing, KV cache off) for the duration of the run. ``dropout=False`` trains with
    the model in eval mode, so every dropout of every architecture is off (gradients flow in eval mode
    just the same): grpo needs its policy ratios taken against the very forward that sampled.

    ``log``, when given, gets one record per step: {"step", "loss", "lr" (the rate that step used),
    "grad_norm" (before clipping)} and whatever ``step_figures()`` returns after the step (grpo's clip
    shares, KL, entropy). It is checkpointed with the run, so a resumed run's log has every step.
    Recording changes nothing the step computes.

    ``carry``: one optimizer and one learning-rate schedule over several calls (grpo's on-policy
    rounds): the first call makes them, for ``carry.total_steps``, and later calls go on with them.
    A fresh AdamW per call would restart its moment estimates, whose first steps move every weight
    by about the learning rate whatever its gradient, and restart the warm-up.
    """
    import torch
    from tqdm.auto import tqdm

    if micro_batch_size < 0:
        raise ValueError(f"micro_batch_size ({micro_batch_size}) must be >= 0")
    if micro_batch_size and loss_tokens is None:
        raise ValueError("micro-batching needs loss_tokens: the token count each micro-batch's loss is divided by")
    steps = len(batches)
    losses: list[float] = []
    tokens = 0
    devices = _cuda_devices(model)
    # fork_rng: the seed governs this run without resetting the caller's global random stream.
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        if carry is not None and carry.optimizer is not None:
            optimizer, scheduler = carry.optimizer, carry.scheduler
        else:
            optimizer, scheduler = _new_optimizer(model, lr, warmup_steps,
                                                  carry.total_steps if carry is not None else steps)
            if carry is not None:
                carry.optimizer, carry.scheduler = optimizer, scheduler
        done = 0
        if checkpoint is not None:
            done, losses, tokens, logged = _resume(checkpoint, model, optimizer, scheduler)
            if log is not None:
                log[:] = logged
        model.train(dropout)
        bar = tqdm(total=steps, desc="training", unit="step", disable=not progress, initial=done)
        try:
            with _activation_checkpointing(model, gradient_checkpointing, dropout):
                for step, indices in enumerate(batches[done:], start=done + 1):
                    loss_value, batch_tokens = _accumulate(step_loss, indices, micro_batch_size, loss_tokens)
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    step_lr = scheduler.get_last_lr()[0]
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    losses.append(loss_value)
                    tokens += batch_tokens
                    if log is not None:
                        log.append({"step": step, "loss": loss_value, "lr": step_lr, "grad_norm": float(grad_norm),
                                    **(step_figures() if step_figures else {})})
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
                    if checkpoint is not None and step % checkpoint.every == 0 and step < steps:
                        _save_checkpoint(checkpoint, model, optimizer, scheduler, step, losses, tokens, log or [])
        finally:
            bar.close()
            model.eval()
    if checkpoint is not None:
        import shutil

        shutil.rmtree(checkpoint.directory, ignore_errors=True)  # done: nothing left to resume
    return losses, tokens


def _accumulate(step_loss: Any, indices: list[int], micro_batch_size: int,
                loss_tokens: Callable[[list[int]], int] | None) -> tuple[float, int]:
    """Backward through one batch, whole or in micro-batches; returns (the batch's loss, tokens fed)."""
    if not micro_batch_size or micro_batch_size >= len(indices):
        loss, tokens = step_loss(indices, None)
        loss.backward()
        return float(loss.detach()), tokens
    denominator = loss_tokens(indices)
    total, tokens = 0.0, 0
    for start in range(0, len(indices), micro_batch_size):
        loss, part_tokens = step_loss(indices[start : start + micro_batch_size], denominator)
        loss.backward()
        total += float(loss.detach())
        tokens += part_tokens
    return total, tokens


def _cuda_devices(model: Any) -> list[int]:
    """The CUDA device the model is on, for fork_rng and checkpoints (dropout draws from its generator)."""
    device = getattr(model, "device", None)
    if device is None or getattr(device, "type", None) != "cuda":
        return []
    import torch

    return [device.index if device.index is not None else torch.cuda.current_device()]


@contextmanager
def _activation_checkpointing(model: Any, enabled: bool, dropout: bool) -> Iterator[None]:
    """transformers' activation (gradient) checkpointing on ``model`` while the block runs, KV cache off.

    transformers checkpoints a layer only while that layer is in training mode. When training runs
    in eval mode (``dropout=False``), the checkpointed layers alone are flagged as training: their
    submodules (attention, MLP, every dropout) stay in eval mode, so dropout stays off. A layer
    whose own forward applies dropout (rare; OPT- and Falcon-style blocks do) would then drop out
    again: grpo's logprob consistency figures would show it.
    """
    if not enabled:
        yield
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wraps the model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"train.gradient_checkpointing: {type(base).__name__} does not support it")
    # transformers 5.2x renamed gradient_checkpointing_* to activation_checkpointing_* (the old names warn).
    enable = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
    disable = getattr(base, "activation_checkpointing_disable", None) or base.gradient_checkpointing_disable
    use_cache = getattr(base.config, "use_cache", None)
    had_input_hook = hasattr(base, "_require_grads_hook")  # enable() adds one that disable() may leave
    enable()
    base.config.use_cache = False
    if not dropout:
        for module in base.modules():
            if _is_checkpointed_layer(module):
                module.training = True  # not .train(): that would switch its submodules' dropout on
    try:
        yield
    finally:
        disable()
        if not had_input_hook and hasattr(base, "_require_grads_hook"):
            base.disable_input_require_grads()
        if use_cache is not None:
            base.config.use_cache = use_cache
        model.eval()


def _is_checkpointed_layer(module: Any) -> bool:
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # older transformers: every module with the flag checks its own training mode
        return getattr(module, "gradient_checkpointing", False) is True
    return isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing is True


def _save_checkpoint(checkpoint: Checkpointing, model: Any, optimizer: Any, scheduler: Any, step: int,
                     losses: list[float], tokens: int, log: list[dict[str, float]]) -> None:
    """Write the whole training state atomically: a kill mid-write leaves the previous checkpoint."""
    import os
    from pathlib import Path

    import torch

    directory = Path(checkpoint.directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {"identity": checkpoint.identity, "step": step, "losses": losses, "tokens": tokens, "log": log,
             "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": torch.get_rng_state()}
    for index in _cuda_devices(model):
        state["cuda_rng"] = torch.cuda.get_rng_state(index)
    partial = directory / (CHECKPOINT_FILE + ".partial")
    torch.save(state, partial)
    os.replace(partial, directory / CHECKPOINT_FILE)

    fault_point("train:checkpoint")  # tests kill a run here, mid-training


def _resume(checkpoint: Checkpointing, model: Any, optimizer: Any,
            scheduler: Any) -> tuple[int, list[float], int, list[dict[str, float]]]:
    """(steps done, losses, tokens, step log) from the checkpoint of this run, or (0, [], 0, []) when
    there is none."""
    from pathlib import Path

    import torch

    path = Path(checkpoint.directory) / CHECKPOINT_FILE
    if not path.exists():
        return 0, [], 0, []
    state = torch.load(path, map_location="cpu", weights_only=False)
    found, wanted = state["identity"], checkpoint.identity
    changed = sorted(key for key in set(found) | set(wanted) if found.get(key) != wanted.get(key))
    if changed:
        raise ResumeRefused(
            f"{path}: a checkpoint of a different training run; changed since it was written: "
            + ", ".join(changed) + f". Delete {checkpoint.directory} to train from the start.")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    for index in _cuda_devices(model):
        if "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"], index)
    return state["step"], list(state["losses"]), state["tokens"], list(state.get("log", []))


def _batch_indices(n: int, batch_size: int, steps: int, rng: random.Random,
                   lengths: list[int] | None = None) -> list[list[int]]:
    """``steps`` batches of example indices: epochs of reshuffled orders, cut into batch_size runs.

    A batch may straddle two epochs, so every batch is full and every example is seen equally often.
    With ``lengths``, examples longer than LONG_FACTOR x the median (failure→fix prompts are ~3x the
    rest) are batched with each other inside each window of GROUP_WINDOW batches, so a few of them no
    longer pad almost every batch to their length (measured: 2.7k -> 4.7k training tokens/s). The others
    keep their shuffled order: sorting everything by length would make batches one task kind each,
    which measurably hurt learning.
    """
    stream: list[int] = []
    need = steps * batch_size
    while len(stream) < need:
        order = list(range(n))
        rng.shuffle(order)
        stream.extend(order)
    stream = stream[:need]
    if lengths is not None:
        threshold = LONG_FACTOR * sorted(lengths)[len(lengths) // 2]
        window = batch_size * GROUP_WINDOW
        grouped: list[int] = []
        for start in range(0, need, window):
            chunk = stream[start : start + window]
            chunk = [i for i in chunk if lengths[i] <= threshold] + [i for i in chunk if lengths[i] > threshold]
            runs = [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
            rng.shuffle(runs)
            grouped.extend(i for run in runs for i in run)
        stream = grouped
    return [stream[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def _collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-pad a batch; padded positions are masked out of attention and of the loss."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in rows])  # (B, T)
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])  # (B, T)
    labels = torch.tensor([lab + [IGNORE_INDEX] * (width - len(lab)) for _, lab in rows])  # (B, T)
    return input_ids, attention_mask, labels


def _padded(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Any]:
    input_ids, attention_mask, labels = _collate(rows, pad_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """Example indices grouped into rows of at most ``width`` tokens: first-fit, longest first.

    Deterministic (ties keep the input order), so a batch always packs the same way.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(width - lengths[i])
    return rows


def _pack(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Any]:
    """The batch's examples packed into rows as wide as its longest example.

    Each example's positions restart at 0; with no attention mask and no cache, transformers reads
    the restarts as packed sequences and builds a block-diagonal causal mask, so no token attends
    across examples (the padding tail of a row is a segment of its own). Each example's first label
    is IGNORE_INDEX: the loss shifts labels by one inside a row, and the previous example's last
    position must not learn to predict the next example's first token. (A prompt's first token is
    never a target in a padded batch either.)
    """
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids, positions, labels = [], [], []
    for members in pack_rows([len(ids) for ids, _ in rows], width):
        ids_row, pos_row, lab_row = [], [], []
        for i in members:
            ids, lab = rows[i]
            ids_row += ids
            pos_row += range(len(ids))
            lab_row += [IGNORE_INDEX] + lab[1:]
        tail = width - len(ids_row)
        input_ids.append(ids_row + [pad_id] * tail)
        positions.append(pos_row + list(range(tail)))
        labels.append(lab_row + [IGNORE_INDEX] * tail)
    return {"input_ids": torch.tensor(input_ids), "position_ids": torch.tensor(positions),
            "labels": torch.tensor(labels)}


def _packing_agrees(model: Any, padded: dict[str, Any], packed: dict[str, Any]) -> bool:
    """Whether ``model`` gives the packed batch the padded batch's loss (its attention honours the
    restarted positions). Models built on transformers' mask utilities do; one that ignores position
    ids for masking would let packed examples attend to each other, and is trained padded."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            losses = [model(**{k: t.to(model.device) for k, t in inputs.items()}, use_cache=False).loss.float()
                      for inputs in (padded, packed)]
    finally:
        model.train(was_training)
    return bool(torch.isclose(losses[0], losses[1], rtol=1e-4, atol=1e-5))


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


def _new_optimizer(model: Any, lr: float, warmup_steps: int, steps: int) -> tuple[Any, Any]:
    """AdamW (no weight decay) with warm-up then cosine decay over ``steps``."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(warmup_steps, steps))


def _warmup_cosine(warmup_steps: int, steps: int) -> Any:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor
