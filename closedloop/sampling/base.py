"""The sampling seam: one protocol, three backends (hf, vllm, openai-compatible servers).

The sample stage and the benchmark runner both ask a :class:`Sampler` for k completions per prompt;
``sample.backend`` in params.yaml picks which one (:func:`open_sampler`). A sampler returns plain
records (:class:`Completion`), never tensors or handles, so a shard of prompts can move to another
process, an inference server or a Ray worker without the stage changing. Backends differ in what
they can return (an OpenAI-compatible server gives no token ids, most give no log-probabilities
after temperature); each declares it in :class:`Capabilities`, and the loop fills the rest (GRPO
recomputes missing log-probabilities under the champion).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from closedloop.models.prompts import PromptFormatError, prompt_format


@dataclass(frozen=True)
class Completion:
    text: str  # the completion only, cut before the earliest stop string
    token_ids: tuple[int, ...]  # as sampled, or (capabilities.token_ids False) the text re-tokenised
    finish_reason: str  # "eos" | "stop" | "length"
    prompt_tokens: int  # the rendered prompt's tokens, special tokens included
    completion_tokens: int
    # log-probability of each token under the sampling distribution (logits / temperature); None when
    # the backend does not return them (capabilities.logprobs False).
    logprobs: tuple[float, ...] | None
    latency_s: float  # wall time of the request or batch this completion came from


@dataclass(frozen=True)
class Capabilities:
    token_ids: bool  # the tokens as the model drew them (else: the text re-tokenised locally)
    logprobs: bool  # per-token sampling log-probabilities after temperature
    seeded: bool  # the same seed and inputs give the same samples


@dataclass(frozen=True)
class SamplingStats:
    wall_s: float
    sequences: int
    completion_tokens: int
    tokens_per_s: float
    samples_per_s: float

    @classmethod
    def of(cls, results: list[list[Completion]], wall_s: float) -> "SamplingStats":
        sequences = sum(len(row) for row in results)
        tokens = sum(c.completion_tokens for row in results for c in row)
        return cls(wall_s=wall_s, sequences=sequences, completion_tokens=tokens,
                   tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
                   samples_per_s=sequences / wall_s if wall_s > 0 else 0.0)


class Sampler(Protocol):
    backend: str
    capabilities: Capabilities
    context_length: int | None  # tokens the model attends over (prompt + completion); None: unknown
    prompt_record: dict[str, Any]  # the prompt format, as saved with the sampling settings

    def prompt_tokens(self, prompts: list[str]) -> list[int]:
        """How many tokens each prompt is once rendered (chat template) and tokenised."""

    def sample(self, prompts: list[str], *, k: int, seed: int, batch_size: int,
               progress: bool = False, first: int = 0) -> tuple[list[list[Completion]], SamplingStats]:
        """k completions per prompt; ``result[i][j]`` is the j-th of prompt i. Temperature 0 is greedy.

        ``first`` is the position of ``prompts[0]`` in the whole batch, when these prompts are one
        shard of it: a prompt's samples depend on the seed and its position, never on the sharding
        (``first`` must be a multiple of :meth:`shard_unit`)."""

    @classmethod
    def shard_unit(cls, settings: Any, k: int, batch_size: int) -> int:
        """The prompts a shard boundary must not cut: 1 where each prompt is sampled on its own."""

    def close(self) -> None:
        """Release the model, the engine or the managed server."""


class SamplingError(RuntimeError):
    """The backend could not sample (server down, wrong model, timeout); the message says where."""


class PromptTooLong(SamplingError):
    pass


# Imported on first use: a backend's heavy dependencies (torch, vllm, an HTTP client) load only when
# it is the one params.yaml names.
BACKENDS = {
    "hf": "closedloop.sampling.hf_backend:HfSampler",
    "vllm": "closedloop.sampling.vllm_backend:VllmSampler",
    "openai": "closedloop.sampling.openai_backend:OpenAISampler",
}


def open_sampler(params: Any, model_dir: Path) -> Sampler:
    """The sampler ``params.sample.backend`` names, on the model in ``model_dir``. Close it when done
    (it is a context manager)."""
    return backend_class(params)(params, Path(model_dir))


def backend_class(params: Any) -> type:
    """The class of the sampler ``params.sample.backend`` names (its module imported, nothing opened)."""
    module, _, cls = BACKENDS[params.sample.backend.name].partition(":")
    return getattr(importlib.import_module(module), cls)


def check_prompt_lengths(sampler: Sampler, prompts: list[str], names: list[str], max_new_tokens: int) -> list[int]:
    """Refuse, naming the task, any prompt that leaves no room for a completion in the model's context.

    Returns each prompt's token count. A prompt that fits but leaves fewer than ``max_new_tokens``
    is not refused: its completion ends at the context limit with finish reason "length".
    """
    lengths = sampler.prompt_tokens(prompts)
    limit = sampler.context_length
    if limit:
        too_long = [(name, n) for name, n in zip(names, lengths) if n >= limit]
        if too_long:
            shown = ", ".join(f"{name} ({n} tokens)" for name, n in too_long[:5])
            more = f" and {len(too_long) - 5} more" if len(too_long) > 5 else ""
            raise PromptTooLong(
                f"{len(too_long)} prompt(s) do not fit the model's context of {limit} tokens: {shown}{more}. "
                f"Shorten those tasks, or use a model with a longer context (max_new_tokens is {max_new_tokens})")
    return lengths


class SamplerBase:
    """What every backend shares: settings from params, the prompt format, context management."""

    backend = "base"

    def __init__(self, params: Any, model_dir: Path) -> None:
        self.params = params
        self.settings = params.sample
        self.model_dir = Path(model_dir)

    def _resolve_prompt_format(self, tokenizer: Any) -> None:
        try:
            self.prompt_format = prompt_format(self.settings, self.params.model, tokenizer)
        except PromptFormatError as error:
            raise SamplingError(str(error)) from None
        self.tokenizer = tokenizer
        self.prompt_record = self.prompt_format.record(tokenizer)

    def render(self, prompts: list[str]) -> list[str]:
        return [self.prompt_format.render(self.tokenizer, p) for p in prompts]

    def prompt_tokens(self, prompts: list[str]) -> list[int]:
        encoded = self.tokenizer(self.render(prompts), add_special_tokens=self.prompt_format.add_special_tokens)
        return [len(ids) for ids in encoded["input_ids"]]

    @classmethod
    def shard_unit(cls, settings: Any, k: int, batch_size: int) -> int:
        return 1

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def eos_token_ids(*values: Any) -> set[int]:
    """Every EOS id named by ``values`` (a generation config's eos_token_id, the tokenizer's: an int, a
    list of ints or None); empty when none is."""
    ids: set[int] = set()
    for value in values:
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return ids


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """``text`` cut before its earliest stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)
