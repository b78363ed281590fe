"""A tiny chat model for tests, built here with no download: a Qwen2-architecture causal LM with its own
byte-level BPE tokenizer and a Qwen-style ChatML chat template.

It stands in for a real instruct checkpoint (Qwen2.5-*-Instruct) wherever a test needs what such a
directory has and the built-in lacks: ``tokenizer.chat_template``, ``<|im_start|>`` / ``<|im_end|>``
special tokens, eos ``<|im_end|>`` and pad ``<|endoftext|>``, ``architectures: [Qwen2ForCausalLM]``.
Its weights are random (seeded): what it writes is noise, so tests check plumbing, not replies.

    from tests.chat_model import build_chat_model
    path = build_chat_model(tmp_path / "chat", ["def f(xs):\\n    return sum(xs)\\n"])
    AutoTokenizer.from_pretrained(path).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
"""

from __future__ import annotations

from pathlib import Path

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2 (Qwen's order)
DEFAULT_SYSTEM = "You are a helpful assistant."

# Qwen2.5's template without the tool-calling branches: a default system message when none is given,
# every message as <|im_start|>role\ncontent<|im_end|>\n, and the assistant header to generate after.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Words the template writes, so the tokenizer has pieces for them whatever the corpus.
_TEMPLATE_TEXT = ["system\n" + DEFAULT_SYSTEM + "\n", "user\n", "assistant\n"]


def train_chat_tokenizer(corpus: list[str], vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus``, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(list(corpus) + _TEMPLATE_TEXT, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=IM_END, pad_token=ENDOFTEXT,
                                   clean_up_tokenization_spaces=False, model_max_length=512)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_chat_model(out_dir: Path, corpus: list[str], seed: int = 0, *, vocab_size: int = 512) -> Path:
    """Save a tiny random Qwen2ForCausalLM and its chat tokenizer to ``out_dir``; returns ``out_dir``.

    hidden 32, 2 layers, 2 attention heads over 1 key/value head, intermediate 64, 512 positions,
    tied embeddings; generation stops at ``<|im_end|>``. The same corpus and seed give the same weights.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_chat_tokenizer(corpus, vocab_size)
    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=pad)
    with torch.random.fork_rng(devices=[]):  # seeding must not disturb the caller's random stream
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.float().eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
