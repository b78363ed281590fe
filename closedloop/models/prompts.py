"""How a task prompt becomes the model's input: as raw text, or through the tokenizer's chat template.

One object, used by sampling, training and evaluation alike, so the model is trained on exactly the
token sequence it is sampled with. Its record (the format, a hash of the template, the system prompt)
travels in every model directory's ``closedloop_sampling.json`` and is part of the mismatch check:
a model trained on chat-formatted prompts and sampled on raw ones is a silent distribution shift.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

# What a sampler or trainer is given as a prompt: the task's text, or (a chat model's episode after its
# first round) the turns so far, [{"role": "user" | "assistant", "content": ...}, ...].
Prompt = str | list[dict[str, str]]

BUILTIN_PREFIX = "builtin:"
# A raw continuation runs on past its answer into the next function or script; these end it. A chat
# reply ends with the template's end-of-turn token, and these would cut a fenced ```python block
# right after its first line.
RAW_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")


@dataclass(frozen=True)
class PromptFormat:
    kind: str  # "raw" | "chat"
    system_prompt: str | None = None
    stop: tuple[str, ...] = RAW_STOPS  # sample.stop, or the format's default when that is empty

    def render(self, tokenizer: Any, prompt: Prompt) -> str:
        """The text the model reads before its completion. ``prompt`` is a task prompt, or (chat) the
        turns of an episode so far (episode_turns), rendered by the template as alternating turns."""
        if self.kind == "raw":
            if not isinstance(prompt, str):
                raise PromptFormatError("a raw prompt is text; chat turns were given (a transcript of a chat model's "
                                        "episode sampled or trained as raw)")
            return prompt
        return tokenizer.apply_chat_template(self.messages(prompt), tokenize=False, add_generation_prompt=True)

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        """The chat messages of ``prompt``: the system prompt, then its turns (a task prompt: one user turn)."""
        turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + turns

    @property
    def add_special_tokens(self) -> bool:
        # A chat template writes its own BOS / special tokens as text; adding them again would double them.
        return self.kind == "raw"

    def encode(self, tokenizer: Any, prompt: Prompt) -> list[int]:
        """Token ids of the rendered prompt, exactly as every sampler and trainer feeds them."""
        return tokenizer(self.render(tokenizer, prompt), add_special_tokens=self.add_special_tokens)["input_ids"]

    def record(self, tokenizer: Any) -> dict[str, Any]:
        """What the saved sampling settings hold about the prompt (see models/settings.py)."""
        return {"prompt_format": self.kind,
                "chat_template": template_hash(tokenizer) if self.kind == "chat" else None,
                "system_prompt": self.system_prompt if self.kind == "chat" else None,
                "stop": list(self.stop)}


FEEDBACK_TURN = "The visible checks say: {feedback}\nWrite your whole answer again, corrected."


def episode_turns(task_prompt: str, attempts: list[tuple[str, str]]) -> list[dict[str, str]]:
    """A chat model's transcript after some attempts: the task as the user's turn, then each attempt as
    the assistant's and the feedback on it as the user's, for the template to render."""
    turns = [{"role": "user", "content": task_prompt}]
    for attempt, feedback in attempts:
        turns += [{"role": "assistant", "content": attempt},
                  {"role": "user", "content": FEEDBACK_TURN.format(feedback=feedback or "the checks failed")}]
    return turns


def prompt_key(prompt: Prompt) -> str:
    """A prompt as a hashable, comparable key (chat turns as canonical JSON)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def episode_prompt(task_prompt: str, attempts: list[tuple[str, str]]) -> str:
    """The raw transcript a round after the first is sampled on: each earlier attempt with the feedback
    on it, then the task again. One attempt gives a failure→fix pair's prompt, so a policy trained on
    those pairs reads a transcript in a form it knows."""
    return _raw_transcript(task_prompt, attempts)[0]


def _raw_transcript(task_prompt: str, attempts: list[tuple[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """episode_prompt's text, and where in it each attempt's own text lies (character offsets)."""
    transcript, spans = task_prompt, []
    for attempt, feedback in attempts:
        spans.append((len(transcript), len(transcript) + len(attempt)))
        attempt = attempt if attempt.endswith("\n") else attempt + "\n"
        note = " ".join(feedback.split())[:200] or "the tests failed"
        transcript += f"{attempt}# Error: {note}\n# Corrected:\n{task_prompt}"
    return transcript, spans


def transcript_tokens(fmt: PromptFormat, tokenizer: Any, task_prompt: str,
                      attempts: list[tuple[str, str]]) -> tuple[Prompt, list[int], list[tuple[int, int] | None]]:
    """An episode's transcript after the earlier ``attempts`` (attempt, feedback shown): the prompt its
    next round is sampled on (raw text, or chat turns), that prompt's token ids (``fmt.encode``), and for
    each attempt the positions [start, end) of the tokens that are the model's own: those whose visible
    characters lie inside the attempt's text (None where there are none). Everything else (the task, the
    feedback, the template's markup) is context.

    A raw transcript places each attempt where episode_prompt put it; a chat template's rendering is
    searched for each assistant turn in order, after the task's turn (an attempt the template rewrote
    is not found, and gets no span). A slow tokenizer has no offsets: then no attempt gets a span."""
    if fmt.kind == "raw":
        prompt, chars = _raw_transcript(task_prompt, attempts)
        text = fmt.render(tokenizer, prompt)
    else:
        prompt = episode_turns(task_prompt, attempts)
        text = fmt.render(tokenizer, prompt)
        first = text.find(task_prompt)
        chars = _located(text, [attempt.strip() for attempt, _ in attempts],
                         start=first + len(task_prompt) if first >= 0 else 0)
    try:
        encoded = tokenizer(text, add_special_tokens=fmt.add_special_tokens, return_offsets_mapping=True)
    except NotImplementedError:  # a slow (Python) tokenizer has no offsets
        return (prompt, list(tokenizer(text, add_special_tokens=fmt.add_special_tokens)["input_ids"]),
                [None] * len(attempts))
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    spans: list[tuple[int, int] | None] = []
    for where in chars:
        inside = [i for i, (s, e) in enumerate(offsets) if where and _within(text, s, e, *where)]
        spans.append((inside[0], inside[-1] + 1) if inside else None)
    return prompt, ids, spans


def _within(text: str, start: int, end: int, lo: int, hi: int) -> bool:
    """Whether the token at text[start:end] is the attempt's at text[lo:hi]: wholly inside it, or its
    visible characters are (a byte-level token carries the whitespace before it)."""
    if end <= start:
        return False  # a special token has no characters of its own
    if lo <= start and end <= hi:
        return True
    piece = text[start:end]
    visible = piece.strip()
    first = start + (len(piece) - len(piece.lstrip()))
    return bool(visible) and lo <= first and first + len(visible) <= hi


def _located(text: str, attempts: list[str], *, start: int) -> list[tuple[int, int] | None]:
    """Each attempt's character span in ``text``, searched in order from ``start`` (None: not found, or
    empty)."""
    spans: list[tuple[int, int] | None] = []
    cursor = start
    for attempt in attempts:
        at = text.find(attempt, cursor) if attempt else -1
        spans.append((at, at + len(attempt)) if at >= 0 else None)
        cursor = at + len(attempt) if at >= 0 else cursor
    return spans


def template_hash(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    if isinstance(template, dict):  # several named templates
        template = "\n".join(f"{name}:{text}" for name, text in sorted(template.items()))
    return hashlib.sha256(template.encode()).hexdigest()[:16]


class PromptFormatError(ValueError):
    pass


def prompt_format(sample: Any, model: Any, tokenizer: Any) -> PromptFormat:
    """The format ``sample.prompt_format`` asks for, for this tokenizer and model params.

    ``auto`` is chat when the tokenizer has a chat template and the model is not the built-in (whose
    tokenizer has none and which learns from raw continuations); ``chat`` without a template is refused.
    """
    has_template = bool(getattr(tokenizer, "chat_template", None))
    kind = sample.prompt_format
    if kind == "auto":
        kind = "chat" if has_template and not str(model.name_or_path).startswith(BUILTIN_PREFIX) else "raw"
    if kind == "chat" and not has_template:
        raise PromptFormatError(
            f"sample.prompt_format is chat but the tokenizer of model {model.name_or_path!r} has no chat "
            "template; use prompt_format: raw, or a model whose tokenizer_config.json has a chat_template")
    return PromptFormat(kind, sample.system_prompt, resolve_stop(sample.stop, kind))


def resolve_stop(stop: list[str] | None, kind: str) -> tuple[str, ...]:
    """``sample.stop`` as given, or (when empty) the stop strings of the prompt format."""
    if stop is not None:
        return tuple(stop)
    return RAW_STOPS if kind == "raw" else ()
