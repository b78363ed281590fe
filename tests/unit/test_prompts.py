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
