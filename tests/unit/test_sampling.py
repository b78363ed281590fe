"""Sampling with the transformers backend: shape, determinism, stops, greedy parity with generate()."""

from __future__ import annotations

import pytest

from closedloop.config import BuiltinModelParams
from closedloop.models.builtin import build_builtin_model, train_tokenizer
from closedloop.sampling.hf import Generation, GenerationStats, _truncate, generate
from closedloop.training.causal_lm import Example, train_causal_lm

# One torch thread for these tiny models (see tests/conftest.py: one_torch_thread).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = BuiltinModelParams(
    hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, vocab_size=320, max_position_embeddings=128
)
OPS = {"sum": "sum(xs)", "largest": "max(xs)", "smallest": "min(xs)", "length": "len(xs)"}
# Every completion runs on into a second function, which the stop string "\ndef " cuts off.
TAIL = "\ndef helper():\n    return 0\n"
EXAMPLES = [
    Example(f"# Return the {op} of xs, case {i}.\ndef f(xs):\n", f"    return {expr}\n{TAIL}")
    for i in range(8)
    for op, expr in OPS.items()
]
STOP = ["\ndef ", "\nclass "]


def _settings(**overrides):
    settings = dict(k=3, temperature=1.0, top_p=1.0, max_new_tokens=24, stop=STOP, seed=0, batch_size=8)
    settings.update(overrides)
    return settings


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([e.prompt + e.completion for e in EXAMPLES], TINY.vocab_size)


@pytest.fixture(scope="module")
def random_model(tokenizer):
    return build_builtin_model(TINY, tokenizer, seed=0)


@pytest.fixture(scope="module")
def trained_model(tokenizer):
    model = build_builtin_model(TINY, tokenizer, seed=0)
    train_causal_lm(model, tokenizer, EXAMPLES, steps=200, batch_size=16, lr=3e-3, warmup_steps=10, seed=0)
    return model


def _texts(result):
    return [[g.text for g in row] for row in result]


class TestShape:
    def test_k_generations_per_prompt_in_order(self, random_model, tokenizer):
        prompts = [e.prompt for e in EXAMPLES[:5]]
        result, stats = generate(random_model, tokenizer, prompts, **_settings(k=3, batch_size=4))
        assert [len(row) for row in result] == [3] * 5
        for prompt, row in zip(prompts, result):
            for g in row:
                assert isinstance(g, Generation)
                assert g.prompt_tokens == len(tokenizer(prompt)["input_ids"])  # BOS included
                assert 1 <= g.completion_tokens <= 24
                assert g.finish_reason in {"eos", "stop", "length"} and g.latency_s > 0
        assert isinstance(stats, GenerationStats)
        assert stats.sequences == 15
        assert stats.completion_tokens == sum(g.completion_tokens for row in result for g in row)
        assert stats.wall_s > 0 and stats.tokens_per_s > 0 and stats.samples_per_s > 0

    def test_rows_of_one_prompt_come_from_one_batch(self, random_model, tokenizer):
        # batch_size 4 with k 3 holds one prompt per batch: the latencies tell the batches apart.
        result, _ = generate(random_model, tokenizer, [e.prompt for e in EXAMPLES[:3]], **_settings(batch_size=4))
        assert all(len({g.latency_s for g in row}) == 1 for row in result)

    def test_batch_smaller_than_k(self, random_model, tokenizer):
        result, _ = generate(random_model, tokenizer, [EXAMPLES[0].prompt], **_settings(k=5, batch_size=2))
        assert len(result[0]) == 5

    def test_no_prompts(self, random_model, tokenizer):
        result, stats = generate(random_model, tokenizer, [], **_settings())
        assert result == [] and stats.sequences == 0

    @pytest.mark.parametrize(
        "overrides",
        [dict(k=0), dict(batch_size=0), dict(max_new_tokens=0), dict(temperature=-1.0), dict(top_p=0.0)],
    )
    def test_rejects_bad_settings(self, random_model, tokenizer, overrides):
        with pytest.raises(ValueError):
            generate(random_model, tokenizer, ["x"], **_settings(**overrides))

    def test_leaves_the_model_mode_alone(self, random_model, tokenizer):
        random_model.train()
        try:
            generate(random_model, tokenizer, ["x"], **_settings(progress=True))
            assert random_model.training
        finally:
            random_model.eval()


class TestDeterminism:
    def test_same_seed_same_texts(self, random_model, tokenizer):
        prompts = [e.prompt for e in EXAMPLES[:6]]
        first, _ = generate(random_model, tokenizer, prompts, **_settings(seed=11))
        second, _ = generate(random_model, tokenizer, prompts, **_settings(seed=11))
        assert _texts(first) == _texts(second)
        counts = [[g.completion_tokens for g in row] for row in first]
        assert counts == [[g.completion_tokens for g in row] for row in second]

    def test_different_seed_different_texts(self, random_model, tokenizer):
        prompts = [e.prompt for e in EXAMPLES[:6]]
        first, _ = generate(random_model, tokenizer, prompts, **_settings(seed=11))
        other, _ = generate(random_model, tokenizer, prompts, **_settings(seed=12))
        assert _texts(first) != _texts(other)

    def test_samples_of_one_prompt_differ(self, random_model, tokenizer):
        result, _ = generate(random_model, tokenizer, [EXAMPLES[0].prompt], **_settings(k=4))
        assert len({g.text for g in result[0]}) > 1


class TestGreedy:
    def test_reproduces_the_trained_completion(self, trained_model, tokenizer):
        prompts = [e.prompt for e in EXAMPLES[:4]]
        result, _ = generate(trained_model, tokenizer, prompts, **_settings(temperature=0.0, stop=[], k=2))
        for example, row in zip(EXAMPLES, result):
            assert [g.text for g in row] == [example.completion] * 2
            assert row[0].finish_reason == "eos"
            # The completion's tokens plus EOS.
            completion_ids = tokenizer(example.completion, add_special_tokens=False)["input_ids"]
            assert row[0].completion_tokens == len(completion_ids) + 1

    def test_matches_transformers_generate(self, random_model, tokenizer):
        # Prompts of different lengths share a left-padded batch; each must decode as if alone.
        prompts = ["# Return the sum of xs.\ndef f(xs):\n", "x", "def g(a, b):\n    return a"]
        settings = _settings(temperature=0.0, stop=[], max_new_tokens=12)
        result, _ = generate(random_model, tokenizer, prompts, **settings)
        for prompt, row in zip(prompts, result):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            out = random_model.generate(
                ids, attention_mask=ids.new_ones(ids.shape), do_sample=False, max_new_tokens=12,
                pad_token_id=tokenizer.pad_token_id,
            )
            new = out[0, ids.shape[1]:].tolist()
            assert row[0].completion_tokens == len(new)
            assert row[0].text == tokenizer.decode(new, skip_special_tokens=True)

    def test_tiny_top_p_is_greedy(self, random_model, tokenizer):
        prompts = [e.prompt for e in EXAMPLES[:3]]
        greedy, _ = generate(random_model, tokenizer, prompts, **_settings(temperature=0.0))
        nucleus, _ = generate(random_model, tokenizer, prompts, **_settings(top_p=1e-6, seed=5))
        assert _texts(greedy) == _texts(nucleus)


class TestStops:
    def test_stop_string_cuts_the_text(self, trained_model, tokenizer):
        example = EXAMPLES[1]
        result, _ = generate(trained_model, tokenizer, [example.prompt], **_settings(temperature=0.0, k=1))
        g = result[0][0]
        assert g.text == example.completion[: example.completion.index("\ndef ")]
        assert g.finish_reason == "stop"
        # Decoding ended with the token that completed "\ndef ", not at EOS.
        full = len(tokenizer(example.completion, add_special_tokens=False)["input_ids"]) + 1
        assert g.completion_tokens < full

    def test_earliest_of_several_stops_wins(self, trained_model, tokenizer):
        result, _ = generate(
            trained_model, tokenizer, [EXAMPLES[0].prompt],
            **_settings(temperature=0.0, k=1, stop=["\ndef ", "(xs)"]),
        )
        assert result[0][0].text == "    return sum"

    def test_length(self, trained_model, tokenizer):
        settings = _settings(temperature=0.0, max_new_tokens=2)
        result, _ = generate(trained_model, tokenizer, [EXAMPLES[0].prompt], **settings)
        g = result[0][0]
        assert g.finish_reason == "length" and g.completion_tokens == 2
        assert EXAMPLES[0].completion.startswith(g.text)

    @pytest.mark.parametrize(
        "text, stop, eos, expected",
        [
            ("a\ndefb", ["\ndef "], True, ("a\ndefb", "eos")),  # no full match: untouched
            ("a\ndef b", ["\ndef"], False, ("a", "stop")),
            ("xAyBz", ["B", "A"], False, ("x", "stop")),  # earliest occurrence, not first listed
            ("abc", [], False, ("abc", "length")),
            ("abc", [""], True, ("abc", "eos")),  # an empty stop string never matches
            ("STOPabc", ["STOP"], True, ("", "stop")),  # a stop wins over EOS
        ],
    )
    def test_truncate_table(self, text, stop, eos, expected):
        assert _truncate(text, stop, eos) == expected
