"""The ``hf`` backend: transformers in this process, through the decoder in sampling/hf.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from closedloop.models.loading import load_policy
from closedloop.sampling.base import Capabilities, Completion, SamplerBase, SamplingStats
from closedloop.sampling.hf import generate


class HfSampler(SamplerBase):
    backend = "hf"
    capabilities = Capabilities(token_ids=True, logprobs=True, seeded=True)

    def __init__(self, params: Any, model_dir: Path) -> None:
        super().__init__(params, model_dir)

        model = params.model
        self.model, tokenizer = load_policy(model_dir, device=model.device, dtype=model.dtype)
        self._resolve_prompt_format(tokenizer)
        self.context_length = getattr(self.model.config, "max_position_embeddings", None)

    def sample(self, prompts: list[str], *, k: int, seed: int, batch_size: int,
               progress: bool = False, first: int = 0) -> tuple[list[list[Completion]], SamplingStats]:
        s = self.settings
        unit = self.shard_unit(s, k, batch_size)
        if first % unit:
            raise ValueError(f"first ({first}) must be a multiple of the {unit} prompts decoded together")
        generations, stats = generate(
            self.model, self.tokenizer, self.render(prompts), k=k, temperature=s.temperature, top_p=s.top_p,
            max_new_tokens=s.max_new_tokens, stop=list(self.prompt_format.stop), seed=seed, batch_size=batch_size, progress=progress,
            first_batch=first // unit,
            add_special_tokens=self.prompt_format.add_special_tokens, context_length=self.context_length,
        )
        results = [[Completion(text=g.text, token_ids=g.token_ids, finish_reason=g.finish_reason,
                               prompt_tokens=g.prompt_tokens, completion_tokens=g.completion_tokens,
                               logprobs=g.logprobs, latency_s=g.latency_s) for g in row] for row in generations]
        return results, SamplingStats.of(results, stats.wall_s)

    @classmethod
    def shard_unit(cls, settings: Any, k: int, batch_size: int) -> int:
        # Rows decoded together share a batch's padding and its generator (seeded by the batch's
        # position): a shard holds whole batches, and then its samples are those of the unsharded run.
        per_prompt = 1 if settings.temperature == 0 else k
        return max(1, batch_size // per_prompt)

    def close(self) -> None:
        self.model = None
