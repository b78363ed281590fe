"""The optimisation loop every training mode shares: AdamW, warm-up then cosine, gradient clipping,
micro-batches, activation checkpointing, and the checkpoints a killed run resumes from."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from closedloop.training.checkpoints import Checkpointing, cuda_devices, resume, save_checkpoint


if TYPE_CHECKING:
    from closedloop.config import TrainParams


@dataclass(frozen=True)
class RunSettings:
    """How a training run executes, beside what it optimises: the keywords every trainer
    (causal_lm.train_causal_lm, grpo.train_grpo) takes after its own, and what optimize runs with.

    ``seed`` orders the batches and seeds dropout; ``checkpoint`` saves the run to resume from;
    ``micro_batch_size`` (0: the whole batch) and ``gradient_checkpointing`` trade time for memory
    without changing the result beyond rounding (see :func:`optimize`); ``encode_prompt`` tokenises a
    prompt as the sampler fed it (see causal_lm.encode_example)."""

    seed: int
    progress: bool = False
    checkpoint: Checkpointing | None = None
    micro_batch_size: int = 0
    gradient_checkpointing: bool = False
    encode_prompt: Callable[[str], list[int]] | None = None

    @classmethod
    def of(cls, trainer: str, options: dict[str, Any]) -> RunSettings:
        """The settings a trainer was called with as keywords, refused by name as Python would."""
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"{trainer}() got unexpected keyword argument(s): {', '.join(unknown)} "
                            f"(its run settings: {', '.join(sorted(known))})")
        if "seed" not in options:
            raise TypeError(f"{trainer}() missing required keyword argument: 'seed'")
        return cls(**options)


def run_settings(train: TrainParams, *, seed: int, progress: bool, encode_prompt: Callable[[str], list[int]] | None,
                 checkpoint: Checkpointing | None = None) -> dict[str, Any]:
    """The keywords every trainer takes after its own (optimization.RunSettings), from the train
    section's memory settings and the caller's seed, progress, prompt encoding and checkpoint."""
    return {"seed": seed, "progress": progress, "checkpoint": checkpoint, "micro_batch_size": train.micro_batch_size,
            "gradient_checkpointing": train.gradient_checkpointing, "encode_prompt": encode_prompt}


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
        self.optimizer, self.scheduler = new_optimizer(model, lr, warmup_steps, self.total_steps)
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])


def optimize(
    model: Any,
    batches: list[list[int]],
    step_loss: Any,
    *,
    lr: float,
    warmup_steps: int,
    run: RunSettings,
    loss_tokens: Callable[[list[int]], int] | None = None,
    dropout: bool = True,
    log: list[dict[str, float]] | None = None,
    step_figures: Callable[[], dict[str, float]] | None = None,
    carry: Carry | None = None,
) -> tuple[list[float], int]:
    """One AdamW step per batch of example indices; ``step_loss(indices, denominator) -> (loss, tokens)``.

    The loop every training mode shares: warm-up then cosine schedule, gradient clipping at 1.0,
    checkpoints every ``run.checkpoint.every`` steps and resumption from one (see train_causal_lm).
    Returns every step's loss and the tokens fed. Leaves the model in eval mode.

    ``run``: the trainer's :class:`RunSettings`. ``step_loss`` returns the batch's token-mean loss when
    ``denominator`` is None. With ``run.micro_batch_size`` smaller than a batch, each step runs the batch in consecutive micro-batches
    of that size and accumulates their gradients: ``step_loss(part, denominator)`` then returns the
    part's summed token losses over ``denominator = loss_tokens(batch)``, the whole batch's loss
    tokens, so the parts add up to exactly the full batch's mean (the same step, up to rounding).

    ``run.gradient_checkpointing`` recomputes each layer's activations in backward (transformers'
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

    _check_micro_batching(run.micro_batch_size, loss_tokens)
    steps = len(batches)
    # fork_rng: the seed governs this run without resetting the caller's global random stream.
    with torch.random.fork_rng(devices=cuda_devices(model)):
        torch.manual_seed(run.seed)
        optimizer, scheduler, done, losses, tokens = _start(model, lr, warmup_steps, steps, carry, run.checkpoint, log)
        model.train(dropout)
        bar = tqdm(total=steps, desc="training", unit="step", disable=not run.progress, initial=done)
        try:
            with _activation_checkpointing(model, run.gradient_checkpointing, dropout):
                for step, indices in enumerate(batches[done:], start=done + 1):
                    loss_value, batch_tokens, step_lr, grad_norm = _step(model, optimizer, scheduler, step_loss,
                                                                         indices, run.micro_batch_size, loss_tokens)
                    losses.append(loss_value)
                    tokens += batch_tokens
                    if log is not None:
                        log.append({"step": step, "loss": loss_value, "lr": step_lr, "grad_norm": float(grad_norm),
                                    **(step_figures() if step_figures else {})})
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
                    if run.checkpoint is not None and step % run.checkpoint.every == 0 and step < steps:
                        save_checkpoint(run.checkpoint, model, optimizer, scheduler, step, losses, tokens, log or [])
        finally:
            bar.close()
            model.eval()
    if run.checkpoint is not None:
        shutil.rmtree(run.checkpoint.directory, ignore_errors=True)  # done: nothing left to resume
    return losses, tokens


def _check_micro_batching(micro_batch_size: int, loss_tokens: Callable[[list[int]], int] | None) -> None:
    if micro_batch_size < 0:
        raise ValueError(f"micro_batch_size ({micro_batch_size}) must be >= 0")
    if micro_batch_size and loss_tokens is None:
        raise ValueError("micro-batching needs loss_tokens: the token count each micro-batch's loss is divided by")


def _start(model: Any, lr: float, warmup_steps: int, steps: int, carry: Carry | None,
           checkpoint: Checkpointing | None,
           log: list[dict[str, float]] | None) -> tuple[Any, Any, int, list[float], int]:
    """The run's optimizer and schedule (the carried ones, or new), and where it starts: (optimizer,
    scheduler, steps done, their losses, tokens fed), from this run's checkpoint if there is one
    (its step log then replaces ``log``'s records)."""
    if carry is not None and carry.optimizer is not None:
        optimizer, scheduler = carry.optimizer, carry.scheduler
    else:
        optimizer, scheduler = new_optimizer(model, lr, warmup_steps, carry.total_steps if carry is not None else steps)
        if carry is not None:
            carry.optimizer, carry.scheduler = optimizer, scheduler
    if checkpoint is None:
        return optimizer, scheduler, 0, [], 0
    done, losses, tokens, logged = resume(checkpoint, model, optimizer, scheduler)
    if log is not None:
        log[:] = logged
    return optimizer, scheduler, done, losses, tokens


def _step(model: Any, optimizer: Any, scheduler: Any, step_loss: Any, indices: list[int], micro_batch_size: int,
          loss_tokens: Callable[[list[int]], int] | None) -> tuple[float, int, float, Any]:
    """One optimizer step on one batch: (its loss, tokens fed, the learning rate it used, the gradient
    norm before clipping)."""
    import torch

    loss_value, batch_tokens = _accumulate(step_loss, indices, micro_batch_size, loss_tokens)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    step_lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, batch_tokens, step_lr, grad_norm


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


def new_optimizer(model: Any, lr: float, warmup_steps: int, steps: int) -> tuple[Any, Any]:
    """AdamW (no weight decay) with warm-up then cosine decay over ``steps``."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup_steps, steps))


def warmup_cosine(warmup_steps: int, steps: int) -> Any:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor
