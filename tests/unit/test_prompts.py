"""Prompt formats: which one `auto` picks, what chat renders, and the stop strings each brings."""

from __future__ import annotations

import pytest

from closedloop.config import ModelParams, SampleParams
from closedloop.models.prompts import RAW_STOPS, PromptFormatError, prompt_format, template_hash


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.chat_model import build_chat_model

    path = build_chat_model(tmp_path_factory.mktemp("chat") / "m", ["def f(xs):\n    return sum(xs)\n"] * 20)
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def raw_tokenizer():
    from closedloop.models.builtin import train_tokenizer

    return train_tokenizer(["def f(xs):\n    return sum(xs)\n"] * 20, 300)


class TestPromptFormat:
    @pytest.mark.parametrize("asked, name, template, kind", [
        ("auto", "/models/qwen-instruct", True, "chat"),  # a user's model with a template: chat
        ("auto", "builtin:tiny", True, "raw"),  # the built-in learns raw continuations, template or not
        ("auto", "/models/base-model", False, "raw"),  # no template: raw
        ("raw", "/models/qwen-instruct", True, "raw"),  # asked for raw on a chat model
        ("chat", "/models/qwen-instruct", True, "chat"),
    ])
    def test_which_format(self, chat_tokenizer, raw_tokenizer, asked, name, template, kind):
        tokenizer = chat_tokenizer if template else raw_tokenizer
        found = prompt_format(SampleParams(prompt_format=asked), ModelParams(name_or_path=name), tokenizer)
        assert found.kind == kind

    def test_chat_without_a_template_is_refused_naming_the_model(self, raw_tokenizer):
        with pytest.raises(PromptFormatError, match="prompt_format is chat but the tokenizer of model '/m/base'"):
            prompt_format(SampleParams(prompt_format="chat"), ModelParams(name_or_path="/m/base"), raw_tokenizer)

    def test_chat_renders_the_template_and_encodes_without_extra_special_tokens(self, chat_tokenizer):
        fmt = prompt_format(SampleParams(prompt_format="chat", system_prompt="Be brief."),
                            ModelParams(name_or_path="/m"), chat_tokenizer)
        text = fmt.render(chat_tokenizer, "def f(xs):")
        assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\ndef f(xs):<|im_end|>\n<|im_start|>assistant\n"
        assert fmt.encode(chat_tokenizer, "def f(xs):") == chat_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert fmt.record(chat_tokenizer) == {"prompt_format": "chat", "chat_template": template_hash(chat_tokenizer),
                                              "system_prompt": "Be brief.", "stop": []}

    @pytest.mark.parametrize("stop, kind, expected", [
        (None, "raw", list(RAW_STOPS)),  # empty: a raw continuation ends with its function or script
        (None, "chat", []),  # empty: a chat reply ends with its end-of-turn token, not inside its ```python
        (["\n\n"], "chat", ["\n\n"]),  # given: kept as given
        ([], "raw", []),
    ])
    def test_stop_strings_by_format(self, chat_tokenizer, stop, kind, expected):
        fmt = prompt_format(SampleParams(prompt_format=kind, stop=stop), ModelParams(name_or_path="/m"), chat_tokenizer)
        assert list(fmt.stop) == expected


class TestTranscriptTokens:
    """An episode's transcript as tokens: the spans grpo trains are exactly the model's earlier attempts."""

    TASK = "# Return the sum of xs.\ndef f(xs):\n"
    ATTEMPTS = [("    return max(xs)\n", "f([1, 2]) returned 2, expected 3"),
                ("    return xs[0]\n", "f([4, 5]) returned 4, expected 9")]

    @pytest.mark.parametrize("kind", ["raw", "chat"])
    def test_the_spans_are_the_attempts_and_nothing_else(self, chat_tokenizer, raw_tokenizer, kind):
        from closedloop.models.prompts import episode_prompt, episode_turns, transcript_tokens

        tokenizer = chat_tokenizer if kind == "chat" else raw_tokenizer
        fmt = prompt_format(SampleParams(prompt_format=kind), ModelParams(name_or_path="/m"), tokenizer)
        prompt, ids, spans = transcript_tokens(fmt, tokenizer, self.TASK, self.ATTEMPTS)
        # the prompt the next round is sampled on, and its ids as every sampler feeds them
        assert prompt == (episode_turns if kind == "chat" else episode_prompt)(self.TASK, self.ATTEMPTS)
        assert ids == fmt.encode(tokenizer, prompt)
        assert len(spans) == 2 and all(spans)
        assert spans[0][1] <= spans[1][0]
        for (start, end), (attempt, feedback) in zip(spans, self.ATTEMPTS):
            text = tokenizer.decode(ids[start:end])
            # the span is the attempt's own text (a token straddling its edge may be left out), never the
            # feedback or the task
            assert text.strip() and text.strip() in attempt and len(text.strip()) >= len(attempt.strip()) - 2
            assert feedback not in text and "sum of xs" not in text
        # what lies outside the spans holds the task and the feedback
        outside = tokenizer.decode([t for i, t in enumerate(ids) if not any(s <= i < e for s, e in spans)])
        assert "expected 3" in outside and "expected 9" in outside and "sum of xs" in outside
        assert "max(xs)" not in outside

    def test_an_attempt_the_transcript_does_not_hold_gets_no_span(self, chat_tokenizer):
        from closedloop.models.prompts import PromptFormat, transcript_tokens

        class Rewrites(PromptFormat):  # a template that drops what the assistant said
            def render(self, tokenizer, prompt):
                return "".join(turn["content"] for turn in prompt if turn["role"] == "user")

        _, _, spans = transcript_tokens(Rewrites("chat"), chat_tokenizer, self.TASK, self.ATTEMPTS)
        assert spans == [None, None]
