"""What the supervised modes (sft, rft) share: a training mix of (prompt, completion) records, the
warm-start references riding along under a budget, fine-tuned with training/causal_lm.py."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from closedloop.io import read_jsonl
from closedloop.training.causal_lm import Example, train_causal_lm, use_bf16
from closedloop.training.modes.base import TrainingMode, TrainingResult, TrainingRun
from closedloop.training.optimization import run_settings

if TYPE_CHECKING:
    from closedloop.config import TrainParams


@dataclass(frozen=True)
class Budget:
    steps: int
    references: int  # how many of the warm-start references ride along
    reason: str  # how the step count was reached, for the stage metrics


def training_budget(new: int, references: int, *, mode: str, steps: int | None, epochs: float,
                    reference_fraction: float | None, batch_size: int) -> Budget:
    """How many references join the training mix and how many steps train on it.

    ``new`` counts the batch's examples (positives, fixes, unsolved references) and the replayed ones.
    In rft the references are capped at ``reference_fraction`` of the mix, so with nothing new there
    is nothing to train on (references alone would be the sft control); None keeps all of them. In
    sft the references are the whole mix. The steps are ``steps`` when set (an explicit override),
    otherwise ``epochs`` passes over the mix: the budget follows what the batch brought.
    """
    if mode == "sft" or reference_fraction is None:
        kept = references
    else:
        kept = min(references, math.floor(new * reference_fraction / (1 - reference_fraction)))
    total = (0 if mode == "sft" else new) + kept
    if steps is not None:
        return Budget(steps if total else 0, kept, f"train.steps: {steps}")
    planned = math.ceil(epochs * total / batch_size)
    return Budget(planned, kept, f"{epochs:g} epochs of {total} examples at batch {batch_size}")


class SupervisedMode(TrainingMode):
    """Fine-tuning on a mix of the mode's own records (:meth:`new_records`) and, where
    :meth:`uses_references`, a budgeted, seeded subset of the warm-start references."""

    empty_reason = "the training set is empty"  # the untrained reason when the mix is empty

    def new_records(self, run: TrainingRun) -> tuple[list[dict], dict[str, int]]:
        """The mode's records before the references, and how many were replayed from each version."""
        return [], {}

    def uses_references(self, params: TrainParams) -> bool:
        return True

    def train(self, run: TrainingRun) -> TrainingResult:
        params = run.params.train
        records, replay = self.new_records(run)
        references: list[dict] = []
        if self.uses_references(params):
            references = [{**r, "source": "reference"}
                          for r in read_jsonl(run.ws.references, required=("prompt", "completion"))]
        budget = training_budget(len(records), len(references), mode=self.name, steps=params.steps,
                                 epochs=params.epochs, reference_fraction=params.reference_fraction,
                                 batch_size=params.batch_size)
        records += random.Random(run.seed).sample(references, budget.references) \
            if budget.references < len(references) else references
        examples = [Example(prompt=r["prompt"], completion=r["completion"]) for r in records]
        stats = train_causal_lm(
            run.model, run.tokenizer, examples, steps=budget.steps, batch_size=params.batch_size, lr=params.lr,
            warmup_steps=params.warmup_steps, bf16=use_bf16(params.mixed_precision, run.model),
            **run_settings(params, seed=run.seed, progress=run.progress, encode_prompt=run.encode_prompt,
                           checkpoint=run.checkpoint),
        )
        sources: dict[str, int] = {}
        for record in records:
            sources[record["source"]] = sources.get(record["source"], 0) + 1
        figures = {"examples": sources, "replay": replay, "steps": stats.steps, "budget": budget.reason,
                   "references_available": len(references), "tokens": stats.tokens,
                   "padding_share": round(stats.padding_share, 4), "packed": stats.packed,
                   "mixed_precision": "bf16" if stats.bf16 else "fp32",
                   "tokens_per_s": round(stats.tokens_per_s, 1), "first_loss": stats.first_loss,
                   "final_loss": stats.final_loss}
        return TrainingResult(figures, "train.steps is 0" if params.steps == 0 else self.empty_reason)
