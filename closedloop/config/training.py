"""The train stage (rft, sft, grpo, its shaping, replay and LoRA) and the warm start."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator

from closedloop.config.base import Section


class ShapingParams(Section):
    """Process supervision: the verifier's step signals added to the reward the trainer optimises."""

    progress: float = Field(
        0.2, ge=0.0,
        description="Weight of the fraction of the verifier's steps that held (parses, runs, valid JSON, format...).",
    )
    steps: dict[str, float] = Field(
        default_factory=dict, description="Extra weight per named step signal, e.g. {runs: 0.1}; any environment's names.",
    )
    base: Literal["combined", "passed"] = Field(
        "combined",
        description="What the shaped reward starts from: combined, the environment's weighted components (partial "
                    "credit included); passed, 1 when the verifier passed the sample, else 0 (the verdict rft keeps).",
    )


class GrpoParams(Section):
    lr: float = Field(1e-4, gt=0, description="Learning rate in grpo mode (train.lr is for sft and rft).")
    clip: float = Field(0.2, gt=0.0, lt=1.0, description="Policy-ratio clip range: [1 - clip, 1 + clip].")
    beta: float = Field(0.0, ge=0.0, description="Weight of the KL penalty to the sampling policy (0: none).")
    epochs: float = Field(1.0, gt=0.0, description="Passes over the batch's rollouts; sets the steps in grpo mode.")
    scale_advantages: bool = Field(True, description="Divide advantages by their group's standard deviation.")
    negative_weight: float = Field(
        1.0, ge=0.0, description="Weight of below-mean advantages (1: standard GRPO; 0: reinforce only what beat the group).",
    )
    loss: Literal["dapo", "grpo", "dr_grpo"] = Field(
        "dapo",
        description="How token losses become the batch's loss, as TRL names it: dapo, the mean over every completion "
                    "token of the batch; grpo, each completion's mean, then the mean over completions; dr_grpo, the "
                    "token sum over completions x sample.max_new_tokens (no length normalisation).",
    )
    epsilon_high: Optional[float] = Field(
        None, gt=0.0, lt=1.0,
        description="Clip-higher (DAPO): the ratio's upper bound is 1 + epsilon_high; empty: 1 + clip.",
    )
    rounds: int = Field(
        1, ge=1, le=64,
        description="Generations per train stage. 1: train on the sample stage's batch, drawn from the champion. "
                    "R > 1: the batch's tasks are cut into R parts; the first trains on the sample stage's samples, "
                    "each later part is sampled from the policy as trained so far, scored by the reward stage's "
                    "feedback sources and trained on (on-policy, as TRL's steps_per_generation).",
    )


class ReplayParams(Section):
    last: int = Field(
        2, ge=0, description="Mix in the positives of this many earlier iterations' batches (DVC experiments); 0: none.",
    )
    versions: list[str] = Field(
        default_factory=list,
        description="The experiments replayed; set by the loop from `last` before each iteration (a value written by "
                    "hand is overwritten by the next `closedloop run`; set `last: 0` to replay none).",
    )
    max_fraction: float = Field(0.5, ge=0.0, lt=1.0, description="Cap on replayed examples in the training set.")


class LoraParams(Section):
    enabled: bool = Field(False, description="Train LoRA adapters (PEFT) and merge them, instead of every weight.")
    r: int = Field(16, gt=0, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0, description="Adapter scaling: the update is scaled by alpha / r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Adapter dropout (0 keeps training deterministic).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Modules that get adapters, by name.",
    )


class TrainParams(Section):
    mode: Literal["sft", "rft", "grpo"] = Field(
        "rft",
        description="sft: references only; rft: the batch's positives and fixes; grpo: group-relative policy optimisation on all k samples.",
    )
    steps: int | None = Field(
        400, ge=0,
        description="Optimiser steps in sft and rft modes; null: `epochs` passes over the training mix, so the "
                    "budget follows what is new (grpo: grpo.epochs).",
    )
    epochs: float = Field(3.0, gt=0, description="Passes over the training mix when `steps` is unset.")
    reference_fraction: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="rft: cap on the warm-start references' share of the training mix (a seeded subset of them "
                    "rides along with the batch's new examples, so the loop does not forget them); null: all of "
                    "them, whatever the batch holds.",
    )
    batch_size: int = Field(32, gt=0, description="Examples (grpo: rollouts) per step.")
    lr: float = Field(1e-3, gt=0, description="Learning rate in sft and rft modes.")
    warmup_steps: int = Field(10, ge=0, description="Steps of linear learning-rate warm-up before the cosine decay.")
    include_fix_pairs: bool = Field(True, description="Put the batch's failure→fix pairs into the training set (rft).")
    max_fix_fraction: float = Field(0.25, ge=0.0, le=1.0, description="Cap on fix pairs in the training set.")
    include_references: bool = Field(
        True, description="Mix the warm-start references back in, so the loop does not forget them."
    )
    checkpoint_every: int = Field(
        25, ge=0, description="Save the training state every N steps; a killed train stage resumes from it (0: never)."
    )
    micro_batch_size: int = Field(
        0, ge=0, description="Examples per forward pass, gradients accumulated up to batch_size (0: the whole batch).",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward: less memory, ~30% slower.")
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "fp32",
        description="sft, rft and the warm start: bf16 runs the forward's matrix products in bfloat16 (torch.autocast; "
                    "weights, gradients and optimizer state stay float32); fp32 does not; auto: bf16 where the device "
                    "computes it natively (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX), else fp32. grpo "
                    "always trains in fp32.",
    )
    shaping: ShapingParams = ShapingParams()
    grpo: GrpoParams = GrpoParams()
    replay: ReplayParams = ReplayParams()
    lora: LoraParams = LoraParams()

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _not_a_yaml_boolean(cls, value: Any) -> Any:
        # YAML reads off/no/false (and on/yes/true) as booleans: say what to write instead of "got False".
        if isinstance(value, bool):
            raise ValueError(f"got the YAML boolean {str(value).lower()} (off/on/no/yes read as one): "
                             "write fp32, bf16 or auto")
        return value


class WarmstartParams(Section):
    n_references: int = Field(1500, gt=0, description="Reference solutions the warm start learns from.")
    steps: int = Field(800, ge=0, description="Optimiser steps of the warm start.")
    batch_size: int = Field(32, gt=0, description="Examples per step.")
    lr: float = Field(2e-3, gt=0, description="Learning rate.")
    warmup_steps: int = Field(20, ge=0, description="Steps of linear learning-rate warm-up before the cosine decay.")
    tokenizer_corpus_tasks: int = Field(2000, gt=0, description="Generated tasks the builtin tokenizer is trained on.")
    lora: bool = Field(False, description="Warm-start a real model with LoRA adapters (train.lora's settings), merged.")

