"""LoRA (PEFT) for real models: train low-rank adapters, then merge them into the weights.

The candidate is saved merged, so every later stage loads a plain transformers model and the model
fingerprint means the same thing whatever the mode. The built-in tiny model trains in full.
"""

from __future__ import annotations

from typing import Any


def with_lora(model: Any, lora: Any) -> Any:
    """``model`` wrapped with fresh adapters on ``lora.target_modules`` (a closedloop LoraParams).

    Adapter initialisation draws from torch's global generator, so callers seed it (the train stage
    does) to keep the candidate deterministic.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as error:  # e.g. no module matches target_modules
        raise ValueError(f"train.lora.target_modules {list(lora.target_modules)}: {error}") from None


def merged(model: Any) -> Any:
    """The plain model with the trained adapters folded into its weights."""
    return model.merge_and_unload()


def with_seeded_lora(model: Any, lora: Any, seed: int) -> Any:
    """:func:`with_lora`, the adapters initialised from ``seed`` without touching torch's global stream."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the adapters' initialisation
        return with_lora(model, lora)
