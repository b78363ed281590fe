"""What a training mode is: the batch files it trains on, the settings it refuses, and ``train``.

The train stage does what every mode shares (the validation gate, the champion loaded, LoRA, the
checkpoint's identity, the candidate saved with its record) and hands the mode a :class:`TrainingRun`;
the mode trains the model in place and returns a :class:`TrainingResult`. A mode never sees the stage:
what it needs from the layers above training (on-policy sampling and scoring, DVC's saved batches,
per-stage seeds) comes in the run as callables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from closedloop.training.checkpoints import Checkpointing
from closedloop.workspace import Workspace

if TYPE_CHECKING:
    from closedloop.config import Params, TrainParams


def checkpoint_directory(ws: Workspace) -> Path:
    """Where a training run keeps its step checkpoints and, with on-policy rounds, each finished round's policy."""
    return ws.candidate.with_name("candidate.checkpoint")


class TrainingError(ValueError):
    """A mode refused its inputs or settings; the message says which (the stage reports it as a StageError)."""


@dataclass(frozen=True)
class TrainingRun:
    """One training run, as the train stage sets it up."""

    ws: Workspace
    params: Params
    model: Any  # the champion, loaded (with fresh adapters under train.lora): trained in place
    tokenizer: Any
    seed: int  # the stage's seed: batches, dropout, the rounds' split
    encode_prompt: Callable[[str], list[int]]  # prompts tokenised as the sampler fed them
    prompt_record: dict[str, Any]  # the prompt format, saved with each round's policy
    checkpoint: Checkpointing | None
    progress: bool
    seed_of: Callable[[str], int]  # another stream's seed by name (the on-policy rounds' sampling)
    # Samples and scores tasks from a saved policy, as the sample and reward stages do:
    # (policy_dir, tasks, *, round_number, seed) -> train_rounds.jsonl rows (stages/onpolicy.py).
    sample_round: Callable[..., list[dict]]
    # A workspace file as an earlier experiment saved it: (path, version) -> text, read through DVC;
    # raises TrainingError naming what failed (rft's replay).
    read_saved: Callable[[str, str], str]


@dataclass
class TrainingResult:
    figures: dict[str, Any]  # the stage's metrics; "steps" and "examples" (the data mix) among them
    untrained_reason: str  # why no step was trained, should none be (recorded only then)
    steps_log: list[dict[str, float]] | None = None  # per-step figures for the candidate's record
    rounds: list[dict] = field(default_factory=list)  # on-policy samples trained on (train_rounds.jsonl)


class TrainingMode:
    """One value of ``train.mode``. Subclasses set ``name`` and ``mixed_precision`` and implement
    :meth:`inputs` and :meth:`train`; :meth:`check` refuses settings the mode cannot train with."""

    name: str = ""
    mixed_precision: bool = True  # whether train.mixed_precision applies (grpo always trains in float32)

    def check(self, params: Params) -> None:
        """Raise TrainingError for settings this mode cannot train with (before the model loads)."""

    def inputs(self, ws: Workspace, params: TrainParams) -> tuple[Path, ...]:
        """The batch files the run trains on: a checkpoint of a run on other files is refused."""
        raise NotImplementedError

    def train(self, run: TrainingRun) -> TrainingResult:
        raise NotImplementedError
