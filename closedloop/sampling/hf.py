"""Sampling a policy with transformers on CPU: k completions per prompt, deterministic given a seed.

A hand-written decoding loop rather than ``model.generate``, for three measured reasons on CPU:
the KV cache is pre-allocated (transformers' DynamicCache copies itself on every token), rows that
finished (EOS or a stop string) leave the batch and its cache, so a batch costs about what its rows
need rather than what its longest row needs, and a stop string ends its row as soon as it appears.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from closedloop.sampling.base import eos_token_ids


@dataclass(frozen=True)
class Generation:
    text: str  # the completion only, cut before the earliest stop string
    prompt_tokens: int  # including BOS
    completion_tokens: int  # tokens the model produced for this row, EOS included
    finish_reason: str  # "eos" | "stop" | "length"
    latency_s: float  # wall time of the generation batch this completion belonged to
    # The tokens the model produced (EOS and any stop-string token included) and the log-probability
    # of each under the sampling distribution (logits / temperature; greedy: temperature 1): what
    # GRPO's policy ratio is taken against.
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()


@dataclass
class GenerationStats:
    wall_s: float
    sequences: int  # completions returned: len(prompts) * k (greedy rows are computed once per prompt)
    completion_tokens: int  # summed over the returned completions
    tokens_per_s: float
    samples_per_s: float


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    stop: list[str],
    seed: int,
    batch_size: int,
    progress: bool = False,
    first_batch: int = 0,
    add_special_tokens: bool = True,
    context_length: int | None = None,
) -> tuple[list[list[Generation]], GenerationStats]:
    """k completions for each prompt; ``result[i][j]`` is the j-th sample of prompt i.

    ``batch_size`` counts sequences decoded together, so a batch holds ``batch_size // k`` prompts
    (at least one). ``temperature == 0`` is greedy: each prompt is decoded once and repeated k times.
    Batch b draws from a generator seeded with ``seed + first_batch + b``: the same inputs, settings and
    seed give the same texts; a different ``batch_size`` regroups rows and so gives different samples.
    ``first_batch`` is the position of this call's first batch in the whole run, when the prompts are
    one shard of it (whole batches): the shard then gives the samples the unsharded run gives.

    ``add_special_tokens`` is False for prompts a chat template rendered (they hold their own special
    tokens). With ``context_length``, a row stops (finish reason "length") when prompt + completion
    fill the context, rather than running past the position embeddings.
    """
    import torch
    from tqdm.auto import tqdm

    _check_settings(k=k, batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    greedy = temperature == 0
    per_prompt = 1 if greedy else k
    prompts_per_batch = max(1, batch_size // per_prompt)
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    encoded = tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"] if prompts else []
    decoding = dict(pad_id=pad_id, eos_ids=eos_ids, stop=stop, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_p=top_p, tokenizer=tokenizer, context_length=context_length)

    was_training = model.training
    model.eval()
    results: list[list[Generation]] = []
    started = time.perf_counter()
    bar = tqdm(total=len(prompts) * k, desc="sampling", unit="seq", disable=not progress)
    try:
        with torch.inference_mode():
            for batch_index, first in enumerate(range(0, len(encoded), prompts_per_batch)):
                chunk = encoded[first : first + prompts_per_batch]
                generator = torch.Generator().manual_seed(seed + first_batch + batch_index)
                samples = _generate_batch(model, chunk, per_prompt, generator=generator, stop=stop, decoding=decoding)
                # Greedy rows were decoded once per prompt: each stands for all k samples.
                results.extend(row * k if greedy else row for row in samples)
                bar.update(len(chunk) * k)
    finally:
        bar.close()
        model.train(was_training)
    return results, _stats(results, sequences=len(prompts) * k, wall=time.perf_counter() - started)


def _check_settings(*, k: int, batch_size: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    if k < 1 or batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"k ({k}), batch_size ({batch_size}) and max_new_tokens ({max_new_tokens}) must be >= 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature ({temperature}) must be >= 0 and top_p ({top_p}) in (0, 1]")


def _generate_batch(model: Any, chunk: list[list[int]], per_prompt: int, *, generator: Any, stop: list[str],
                    decoding: dict[str, Any]) -> list[list[Generation]]:
    """Decode one batch (``per_prompt`` rows for each prompt of ``chunk``): each prompt's generations.

    ``decoding`` holds _decode_batch's keyword arguments but the generator; every generation carries
    the wall time of the whole batch as its latency.
    """
    batch_start = time.perf_counter()
    rows = [ids for ids in chunk for _ in range(per_prompt)]
    tokens, logprobs, eos_hit = _decode_batch(model, chunk, per_prompt, generator=generator, **decoding)
    texts = _completion_texts(decoding["tokenizer"], rows, tokens)
    latency = time.perf_counter() - batch_start
    results = []
    for p, prompt_ids in enumerate(chunk):
        samples = []
        for j in range(per_prompt):
            r = p * per_prompt + j
            text, reason = _truncate(texts[r], stop, eos_hit[r])
            samples.append(Generation(text, len(prompt_ids), len(tokens[r]), reason, latency,
                                      tuple(tokens[r]), tuple(logprobs[r])))
        results.append(samples)
    return results


def _stats(results: list[list[Generation]], *, sequences: int, wall: float) -> GenerationStats:
    completion_tokens = sum(g.completion_tokens for row in results for g in row)
    return GenerationStats(
        wall_s=wall,
        sequences=sequences,
        completion_tokens=completion_tokens,
        tokens_per_s=completion_tokens / wall if wall > 0 else 0.0,
        samples_per_s=sequences / wall if wall > 0 else 0.0,
    )


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = eos_token_ids(configured, tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer and the model's generation_config define no EOS token")
    return ids


def _decode_batch(
    model: Any,
    prompts: list[list[int]],
    per_prompt: int,
    *,
    pad_id: int,
    eos_ids: set[int],
    stop: list[str],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator: Any,
    tokenizer: Any,
    context_length: int | None = None,
) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """Decode ``per_prompt`` rows per prompt, prompt by prompt.

    Returns the new tokens of each row (EOS included), their log-probabilities under the sampling
    distribution, and whether the row hit EOS.
    """
    import torch

    eos = torch.tensor(sorted(eos_ids), device=model.device)
    stop_checker = _StopChecker(tokenizer, stop)
    cache_arg, cache = _new_cache(model, capacity=max(len(p) for p in prompts) + max_new_tokens)
    n_rows = len(prompts) * per_prompt
    # Tokens a row may hold in all before it fills the context (no limit: never reached).
    rows = _Rows([(context_length or 1 << 30) - len(prompts[row // per_prompt]) for row in range(n_rows)])
    logits, mask, next_position = _prefill(model, prompts, per_prompt, pad_id=pad_id, cache_arg=cache_arg, cache=cache)
    for step in range(max_new_tokens):
        token = _sample(logits, temperature, top_p, generator)  # (A,)
        checking = rows.record(token.tolist(), _logprobs(logits, token, temperature), torch.isin(token, eos).tolist())
        if stop_checker.enabled and checking:
            rows.stop(checking, stop_checker.hits([rows.tokens[rows.batch_rows[i]] for i in checking]))
        if not any(rows.live) or step == max_new_tokens - 1:
            break
        keep_list = rows.compact()
        if keep_list is not None:
            keep = torch.tensor(keep_list, device=model.device)
            cache.batch_select_indices(keep)
            mask, token, next_position = mask[keep], token[keep], next_position[keep]
        mask = torch.cat([mask, mask.new_ones(len(rows.live), 1)], dim=1)  # (A, P + step + 1)
        logits = model(
            input_ids=token[:, None], attention_mask=mask, position_ids=next_position[:, None], use_cache=True,
            **{cache_arg: cache},
        ).logits[:, -1, :]
        next_position = next_position + 1
    return rows.tokens, rows.logprobs, rows.eos_hit


def _prefill(model: Any, prompts: list[list[int]], per_prompt: int, *, pad_id: int, cache_arg: str,
             cache: Any) -> tuple[Any, Any, Any]:
    """Read the prompts into ``cache`` and give each prompt ``per_prompt`` rows.

    Returns the rows' next-token logits (A, V), their attention mask (A, P) and the position of
    their next token (A,), A = len(prompts) * per_prompt.
    """
    import torch

    device = model.device
    width = max(len(p) for p in prompts)
    # Left padding: every row's next token goes in the same (last) column.
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)  # (N, P)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)  # (N, P)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # pads get position 0; they are masked anyway
    # The prompt is read once, then its cache copied to its k rows: with short completions the
    # prompt pass was over half the work.
    # logits_to_keep=1: only the last position's logits are needed, saving the lm_head on the prompt.
    logits = model(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
        **{cache_arg: cache},
    ).logits[:, -1, :]  # (N, V)
    if per_prompt > 1:
        cache.batch_repeat_interleave(per_prompt)
        logits = logits.repeat_interleave(per_prompt, dim=0)  # (A, V), A = N * per_prompt
        mask = mask.repeat_interleave(per_prompt, dim=0)
        positions = positions.repeat_interleave(per_prompt, dim=0)
    return logits, mask, positions[:, -1] + 1


def _logprobs(logits: Any, token: Any, temperature: float) -> list[float]:
    """Each row's log-probability of its sampled token under the sampling distribution (greedy: temperature 1)."""
    import torch

    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    return torch.log_softmax(scaled, dim=-1).gather(1, token[:, None]).squeeze(1).tolist()


class _Rows:
    """The decoding state of a batch's rows: the tokens and log-probabilities each row produced,
    whether it hit EOS, and which rows the batch tensors still hold.

    ``batch_rows[i]`` is the original row index of position i in the batch tensors; ``live[i]``
    whether it still decodes (finished rows ride along until the next compaction).
    """

    def __init__(self, room: list[int]):
        self.room = room  # tokens each row may hold in all before it fills the context
        self.tokens: list[list[int]] = [[] for _ in room]
        self.logprobs: list[list[float]] = [[] for _ in room]
        self.eos_hit = [False] * len(room)
        self.batch_rows = list(range(len(room)))
        self.live = [True] * len(room)

    def record(self, token_list: list[int], logprob_list: list[float], is_eos: list[bool]) -> list[int]:
        """Append one step's tokens to the live rows; the batch positions still live after it (the
        ones to check for a stop string)."""
        checking = []
        for i, row in enumerate(self.batch_rows):
            if not self.live[i]:
                continue
            self.tokens[row].append(token_list[i])
            self.logprobs[row].append(logprob_list[i])
            if is_eos[i]:
                self.eos_hit[row] = True
                self.live[i] = False
            elif len(self.tokens[row]) >= self.room[row]:
                self.live[i] = False  # the context is full: this row ends here, finish reason "length"
            else:
                checking.append(i)
        return checking

    def stop(self, checked: list[int], hits: list[bool]) -> None:
        """End the checked batch positions that completed a stop string."""
        for i, hit in zip(checked, hits):
            if hit:
                self.live[i] = False

    def compact(self) -> list[int] | None:
        """The batch positions to keep when enough rows finished to drop them, else None.

        Dropping finished rows copies the whole cache, so wait until a quarter of the batch is done.
        """
        n_live = sum(self.live)
        if len(self.live) - n_live < max(1, len(self.live) // 4):
            return None
        keep_list = [i for i, alive in enumerate(self.live) if alive]
        self.batch_rows = [self.batch_rows[i] for i in keep_list]
        self.live = [True] * len(keep_list)
        return keep_list


def _new_cache(model: Any, capacity: int) -> tuple[str, Any]:
    """A KV cache for ``model`` and the name of the forward argument that takes it.

    transformers' DynamicCache appends with torch.cat, copying the whole cache every token; on CPU
    that was 60% of a decoding step. Full-attention layers get a pre-allocated buffer instead.
    """
    import inspect

    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    # transformers 5.2x renamed the argument from past_key_values to cache.
    parameters = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    layers = getattr(cache, "layers", None)
    if layers and all(type(layer) is DynamicLayer for layer in layers):
        cache.layers = [_preallocated_layer_class()(capacity) for _ in layers]
    return cache_arg, cache


_LAYER_CLASS: Any = None


def _preallocated_layer_class() -> Any:
    """Defined on first use, so that importing this module does not import transformers."""
    global _LAYER_CLASS
    if _LAYER_CLASS is not None:
        return _LAYER_CLASS
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are views into a buffer written in place."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity
            self.length = 0

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            self.device = key_states.device
            batch, heads, _, dim = key_states.shape
            self.key_buffer = key_states.new_zeros(batch, heads, self.capacity, dim)  # (B, H, C, D)
            self.value_buffer = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:  # never expected; grow rather than fail
                import torch

                extra = max(end, 2 * self.capacity) - self.capacity
                self.key_buffer = torch.cat([self.key_buffer, self.key_buffer.new_zeros(
                    *self.key_buffer.shape[:2], extra, self.key_buffer.shape[-1])], dim=-2)
                self.value_buffer = torch.cat([self.value_buffer, self.value_buffer.new_zeros(
                    *self.value_buffer.shape[:2], extra, self.value_buffer.shape[-1])], dim=-2)
                self.capacity += extra
            self.key_buffer[:, :, self.length : end] = key_states
            self.value_buffer[:, :, self.length : end] = value_states
            self.length = end
            self._expose()
            return self.keys, self.values

        def _expose(self) -> None:
            self.keys = self.key_buffer[:, :, : self.length]
            self.values = self.value_buffer[:, :, : self.length]

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: Any) -> None:
            if self.is_initialized:
                self.key_buffer = self.key_buffer[indices]
                self.value_buffer = self.value_buffer[indices]
                self._expose()

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.is_initialized:
                self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
                self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
                self._expose()

    _LAYER_CLASS = PreallocatedLayer
    return _LAYER_CLASS


def _sample(logits: Any, temperature: float, top_p: float, generator: Any) -> Any:
    import torch

    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p; the top token always stays.
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    cdf = logits.softmax(dim=-1).cumsum(dim=-1)  # (A, V)
    # Inverse-CDF sampling: one uniform per row. torch.multinomial draws one exponential per
    # vocabulary entry and was 30x slower, ~12% of a decoding step. Scaling by the last cdf value
    # keeps the target below it despite rounding; right=True never lands on a zero-probability token.
    # Drawn from the CPU generator whatever the device, so a seed means the same draws everywhere.
    u = torch.rand(cdf.shape[0], 1, generator=generator).to(cdf.device)  # (A, 1)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)


class _StopChecker:
    """Tells which rows just completed a stop string, decoding only each row's last few tokens.

    Rows are checked after every token, so a stop string is first seen in the window that ends with
    the token completing it; a window of (longest stop in bytes + 2) tokens always holds it, because
    every non-special token decodes to at least one byte. The exact cut happens later on the full text.
    """

    def __init__(self, tokenizer: Any, stop: list[str]):
        self.stop = [s for s in stop if s]
        self.enabled = bool(self.stop)
        self.window = max((len(s.encode()) for s in self.stop), default=0) + 2
        self.tokenizer = tokenizer

    def hits(self, rows: list[list[int]]) -> list[bool]:
        texts = _decode_many(self.tokenizer, [r[-self.window :] for r in rows])
        return [any(s in text for s in self.stop) for text in texts]


def _decode_many(tokenizer: Any, rows: list[list[int]]) -> list[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The Rust batch decoder: no per-row Python call, and no "clean-up" of spaces, which would
        # rewrite code.
        return backend.decode_batch(rows, skip_special_tokens=True)
    return tokenizer.batch_decode(rows, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _completion_texts(tokenizer: Any, prompts: list[list[int]], completions: list[list[int]]) -> list[str]:
    """Decode completions in the context of their prompt.

    Decoding the completion alone loses a leading space with SentencePiece-style tokenizers (which
    strip the space of a text's first token); decoding prompt + completion and removing the decoded
    prompt does not. Byte-level BPE gives the same text either way.
    """
    alone = _decode_many(tokenizer, completions)
    full = _decode_many(tokenizer, [p + c for p, c in zip(prompts, completions)])
    heads = _decode_many(tokenizer, prompts)
    return [f[len(h) :] if f.startswith(h) else a for a, f, h in zip(alone, full, heads)]


def _truncate(text: str, stop: list[str], eos_hit: bool) -> tuple[str, str]:
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    if cuts:
        return text[: min(cuts)], "stop"
    return text, "eos" if eos_hit else "length"
