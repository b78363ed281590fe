"""The tiny chat-model fixture (tests/chat_model.py): it loads like an instruct checkpoint and generates."""

from __future__ import annotations

import json

import pytest

from tests.chat_model import ENDOFTEXT, IM_END, IM_START, build_chat_model

CORPUS = ["# Return the sum of xs.\ndef f(xs):\n    return sum(xs)\n",
          'Document:\nAcme Corp\nJSON:\n{"vendor": "Acme Corp"}\n',
          "R1: yes\nR2: no\ndecision: approve\n"] * 4


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return build_chat_model(tmp_path_factory.mktemp("chat"), CORPUS, seed=0)


def test_it_loads_with_a_chatml_template(chat_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_dir)
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Sum [1, 2]."}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nSum [1, 2].<|im_end|>\n<|im_start|>assistant\n")
    default = tokenizer.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=False)
    assert default.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n") and default.endswith("<|im_end|>\n")
    ids = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END])
    assert ids == [0, 1, 2] and tokenizer.eos_token == IM_END and tokenizer.pad_token == ENDOFTEXT
    assert tokenizer(f"{IM_START}user\n")["input_ids"][0] == ids[1]  # one token, never split
    text = "def f(xs):\n    return sum(xs)  # 12 é\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: exact round trip


def test_it_is_a_qwen2_checkpoint_that_generates(chat_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((chat_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["num_key_value_heads"] == 1
    assert config["hidden_size"] == 32 and config["tie_word_embeddings"] is True
    tokenizer = AutoTokenizer.from_pretrained(chat_dir)
    assert json.loads((chat_dir / "generation_config.json").read_text())["eos_token_id"] == tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(chat_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]  # it wrote something (random weights: noise)


def test_the_same_seed_gives_the_same_weights(chat_dir, tmp_path):
    again = build_chat_model(tmp_path / "again", CORPUS, seed=0)
    assert (again / "model.safetensors").read_bytes() == (chat_dir / "model.safetensors").read_bytes()
