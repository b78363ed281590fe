"""A training run's whole state on disk: saved every few steps, resumed only by the run it belongs to.

The state is the weights, the optimizer and its schedule, torch's random state (the CPU's and the
model's CUDA device's: dropout draws from them), the steps done, their losses, the tokens fed and the
step log. Batches are a pure function of the run's seed, so a resumed run ends where an uninterrupted
one would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from closedloop.faults import fault_point

CHECKPOINT_FILE = "state.pt"


@dataclass(frozen=True)
class Checkpointing:
    """Where and how often training saves its whole state, and what identifies the run.

    ``identity`` names what the run is (its data, its settings, its starting model) as plain values;
    resuming from a checkpoint whose identity differs is refused, naming each difference.
    """

    directory: Any  # pathlib.Path
    every: int
    identity: dict[str, Any]


class ResumeRefused(RuntimeError):
    """A checkpoint exists but belongs to a different training run."""


def cuda_devices(model: Any) -> list[int]:
    """The CUDA device the model is on, for fork_rng and checkpoints (dropout draws from its generator)."""
    device = getattr(model, "device", None)
    if device is None or getattr(device, "type", None) != "cuda":
        return []
    import torch

    return [device.index if device.index is not None else torch.cuda.current_device()]


def save_checkpoint(checkpoint: Checkpointing, model: Any, optimizer: Any, scheduler: Any, step: int,
                    losses: list[float], tokens: int, log: list[dict[str, float]]) -> None:
    """Write the whole training state atomically: a kill mid-write leaves the previous checkpoint."""
    import torch

    directory = Path(checkpoint.directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {"identity": checkpoint.identity, "step": step, "losses": losses, "tokens": tokens, "log": log,
             "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": torch.get_rng_state()}
    for index in cuda_devices(model):
        state["cuda_rng"] = torch.cuda.get_rng_state(index)
    partial = directory / (CHECKPOINT_FILE + ".partial")
    torch.save(state, partial)
    os.replace(partial, directory / CHECKPOINT_FILE)

    fault_point("train:checkpoint")  # tests kill a run here, mid-training


def resume(checkpoint: Checkpointing, model: Any, optimizer: Any,
           scheduler: Any) -> tuple[int, list[float], int, list[dict[str, float]]]:
    """(steps done, losses, tokens, step log) from the checkpoint of this run, or (0, [], 0, []) when
    there is none."""
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
    for index in cuda_devices(model):
        if "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"], index)
    return state["step"], list(state["losses"]), state["tokens"], list(state.get("log", []))
