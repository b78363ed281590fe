"""Fine-tuning on (prompt, completion) pairs: label masking, learning, determinism, schedules."""

from __future__ import annotations

import math
import random

import pytest

from closedloop.config import BuiltinModelParams
from closedloop.models.builtin import build_builtin_model, train_tokenizer
from closedloop.sampling.hf import generate
from closedloop.training.batching import IGNORE_INDEX, batch_indices, collate, pack_rows, packed_batch, padded_batch
from closedloop.training.causal_lm import Example, encode_example, train_causal_lm
from closedloop.training.optimization import warmup_cosine

# One torch thread for these tiny models (see tests/conftest.py: one_torch_thread).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = BuiltinModelParams(
    hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, vocab_size=320, max_position_embeddings=128
)
OPS = {"sum": "sum(xs)", "largest": "max(xs)", "smallest": "min(xs)", "length": "len(xs)", "sorted": "sorted(xs)"}
EXAMPLES = [
    Example(f"# Return the {op} of xs, case {i}.\ndef f(xs):\n", f"    return {expr}\n")
    for i in range(10)
    for op, expr in OPS.items()
]  # 50 examples; the completion depends on the operation only
TRAIN = dict(steps=200, batch_size=16, lr=5e-3, warmup_steps=10, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([e.prompt + e.completion for e in EXAMPLES], TINY.vocab_size)


def _fresh_model(tokenizer, seed: int = 0):
    return build_builtin_model(TINY, tokenizer, seed=seed)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained(tokenizer):
    model = _fresh_model(tokenizer)
    stats = train_causal_lm(model, tokenizer, EXAMPLES, **TRAIN)
    return model, stats


class TestEncodeExample:
    @pytest.mark.parametrize(
        "example",
        [
            EXAMPLES[0],  # the usual case
            Example("def f():\n", ""),  # an empty completion still teaches EOS
            Example("", "    return 1\n"),  # an empty prompt is BOS alone
            Example("s = '", "héllo ✓'\n"),  # unicode in the completion
        ],
    )
    def test_only_completion_tokens_carry_labels(self, tokenizer, example):
        input_ids, labels = encode_example(tokenizer, example)
        prompt = tokenizer(example.prompt, add_special_tokens=True)["input_ids"]
        completion = tokenizer(example.completion, add_special_tokens=False)["input_ids"]
        assert input_ids == prompt + completion + [tokenizer.eos_token_id]
        assert input_ids[0] == tokenizer.bos_token_id
        assert labels == [IGNORE_INDEX] * len(prompt) + completion + [tokenizer.eos_token_id]
        assert tokenizer.decode(input_ids, skip_special_tokens=True) == example.prompt + example.completion

    def test_collate_pads_right_and_masks_padding(self, tokenizer):
        rows = [encode_example(tokenizer, e) for e in (EXAMPLES[0], Example("x", "y"))]
        input_ids, attention_mask, labels = collate(rows, pad_id=tokenizer.pad_token_id)
        short = len(rows[1][0])
        assert input_ids.shape == attention_mask.shape == labels.shape == (2, len(rows[0][0]))
        assert input_ids[1, :short].tolist() == rows[1][0]
        assert set(input_ids[1, short:].tolist()) == {tokenizer.pad_token_id}
        assert attention_mask[1].tolist() == [1] * short + [0] * (input_ids.shape[1] - short)
        assert set(labels[1, short:].tolist()) == {IGNORE_INDEX}


class TestTrainCausalLm:
    def test_loss_falls_clearly(self, trained):
        _, stats = trained
        assert stats.steps == 200 and len(stats.losses) == 200 and stats.examples == 50
        assert stats.first_loss == stats.losses[0] and stats.final_loss == stats.losses[-1]
        assert sum(stats.losses[-10:]) / 10 < 0.02 * stats.first_loss
        assert all(math.isfinite(x) for x in stats.losses)

    def test_greedy_generation_reproduces_trained_completions(self, trained, tokenizer):
        model, _ = trained
        assert not model.training
        sample = EXAMPLES[:10]  # two of each operation
        result, _ = generate(
            model, tokenizer, [e.prompt for e in sample], k=1, temperature=0.0, top_p=1.0, max_new_tokens=16,
            stop=[], seed=0, batch_size=8,
        )
        assert [row[0].text for row in result] == [e.completion for e in sample]

    def test_counts_non_pad_tokens(self, trained, tokenizer):
        _, stats = trained
        lengths = [len(encode_example(tokenizer, e)[0]) for e in EXAMPLES]
        batches = batch_indices(len(EXAMPLES), TRAIN["batch_size"], TRAIN["steps"], random.Random(TRAIN["seed"]),
                                 lengths=lengths)
        assert stats.tokens == sum(lengths[i] for batch in batches for i in batch)
        assert stats.wall_s > 0 and stats.tokens_per_s > 0

    def test_deterministic(self, trained, tokenizer):
        model, _ = trained
        again = _fresh_model(tokenizer)
        train_causal_lm(again, tokenizer, EXAMPLES, **TRAIN)
        assert _same(_state(again), _state(model))

    def test_seed_changes_the_order(self, tokenizer):
        a, b = _fresh_model(tokenizer), _fresh_model(tokenizer)
        short = dict(TRAIN, steps=5)
        train_causal_lm(a, tokenizer, EXAMPLES, **short)
        train_causal_lm(b, tokenizer, EXAMPLES, **dict(short, seed=1))
        assert not _same(_state(a), _state(b))

    @pytest.mark.parametrize(
        "examples, steps",
        [(EXAMPLES, 0), ([], 10)],  # no steps; no data
    )
    def test_nothing_to_do_leaves_the_model_untouched(self, tokenizer, examples, steps):
        model = _fresh_model(tokenizer)
        before = _state(model)
        stats = train_causal_lm(model, tokenizer, examples, **dict(TRAIN, steps=steps))
        assert stats.steps == 0 and stats.tokens == 0 and stats.losses == []
        assert stats.first_loss is None and stats.final_loss is None
        assert _same(_state(model), before)

    def test_does_not_touch_the_global_random_stream(self, tokenizer):
        import torch

        torch.manual_seed(0)
        expected = torch.rand(3)
        torch.manual_seed(0)
        train_causal_lm(_fresh_model(tokenizer), tokenizer, EXAMPLES[:4], **dict(TRAIN, steps=2, batch_size=2))
        assert torch.equal(torch.rand(3), expected)

    def test_progress_bar_and_eval_mode(self, tokenizer):
        model = _fresh_model(tokenizer)
        model.train()
        settings = dict(TRAIN, steps=2, batch_size=2)
        stats = train_causal_lm(model, tokenizer, EXAMPLES[:4], **settings, progress=True)
        assert stats.steps == 2 and not model.training

    def test_long_examples_are_cut_to_the_context(self, tokenizer):
        model = _fresh_model(tokenizer)
        long = Example("# long\n", "x = 1\n" * 200)  # far beyond 128 positions
        stats = train_causal_lm(model, tokenizer, [long], **dict(TRAIN, steps=1, batch_size=1))
        assert stats.tokens == TINY.max_position_embeddings

    @pytest.mark.parametrize(
        "overrides",
        [dict(steps=-1), dict(batch_size=0), dict(lr=0.0), dict(warmup_steps=-1)],
    )
    def test_rejects_bad_settings(self, tokenizer, overrides):
        with pytest.raises(ValueError):
            train_causal_lm(_fresh_model(tokenizer), tokenizer, EXAMPLES, **dict(TRAIN, **overrides))

    def test_a_misspelt_or_missing_run_setting_is_refused_by_name(self, tokenizer):
        """The run settings every trainer shares come as keywords (optimization.RunSettings): a typo
        must fail as a misspelt argument would, not be ignored."""
        model = _fresh_model(tokenizer)
        with pytest.raises(TypeError, match="unexpected keyword argument.*micro_batchsize.*micro_batch_size"):
            train_causal_lm(model, tokenizer, EXAMPLES, **TRAIN, micro_batchsize=4)
        without_seed = {key: value for key, value in TRAIN.items() if key != "seed"}
        with pytest.raises(TypeError, match="missing required keyword argument: 'seed'"):
            train_causal_lm(model, tokenizer, EXAMPLES, **without_seed)


class TestBatchIndices:
    def test_epochs_are_permutations_and_batches_full(self):
        batches = batch_indices(10, 4, 5, random.Random(0))  # 20 indices: two epochs
        assert [len(b) for b in batches] == [4] * 5
        flat = [i for b in batches for i in b]
        assert sorted(flat[:10]) == sorted(flat[10:]) == list(range(10))
        assert flat[:10] != flat[10:]  # reshuffled each epoch

    def test_length_grouping_keeps_every_example_and_cuts_padding(self):
        lengths = [100 if i % 8 == 0 else 10 for i in range(64)]  # one long example in eight
        plain = batch_indices(64, 8, 16, random.Random(0))
        grouped = batch_indices(64, 8, 16, random.Random(0), lengths=lengths)
        assert sorted(i for b in grouped for i in b) == sorted(i for b in plain for i in b)
        assert [len(b) for b in grouped] == [8] * 16

        def padded(batches):
            return sum(max(lengths[i] for i in b) * len(b) for b in batches)

        assert padded(grouped) < 0.5 * padded(plain)

    def test_deterministic_given_the_seed(self):
        assert batch_indices(7, 3, 9, random.Random(4)) == batch_indices(7, 3, 9, random.Random(4))
        assert batch_indices(7, 3, 9, random.Random(4)) != batch_indices(7, 3, 9, random.Random(5))


class TestWarmupCosine:
    @pytest.mark.parametrize(
        "warmup, steps, step, expected",
        [
            (10, 100, 0, 1 / 11),  # the first step already moves
            (10, 100, 9, 10 / 11),
            (10, 100, 10, 1.0),  # peak right after warm-up
            (10, 100, 55, 0.5),  # half-way down the cosine
            (10, 100, 99, 0.5 * (1 + math.cos(math.pi * 89 / 90))),  # ~0 at the end
            (0, 1, 0, 1.0),  # a single step uses the full rate
        ],
    )
    def test_table(self, warmup, steps, step, expected):
        assert warmup_cosine(warmup, steps)(step) == pytest.approx(expected)


class TestMemorySettings:
    """Micro-batches and activation checkpointing trade time for memory, not results."""

    SHORT = dict(steps=3, batch_size=16, lr=1e-4, warmup_steps=0, seed=0)

    @staticmethod
    def _max_diff(a, b) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    def _train(self, tokenizer, **settings):
        model = _fresh_model(tokenizer)
        stats = train_causal_lm(model, tokenizer, EXAMPLES, **self.SHORT, **settings)
        return _state(model), stats

    @pytest.mark.parametrize("micro_batch_size", [5, 1])  # uneven parts; one example per forward
    def test_micro_batches_give_the_full_batch_step(self, tokenizer, micro_batch_size):
        """Each micro-batch's loss is its token sum over the whole batch's loss tokens: the parts add
        up to the full batch's token mean, so the losses and the weights equal the whole-batch run's."""
        whole, whole_stats = self._train(tokenizer)
        parts, part_stats = self._train(tokenizer, micro_batch_size=micro_batch_size)
        assert part_stats.losses == pytest.approx(whole_stats.losses, abs=1e-6)
        assert part_stats.tokens == whole_stats.tokens
        assert self._max_diff(whole, parts) < 1e-6

    def test_gradient_checkpointing_gives_the_same_step_and_is_switched_off_after(self, tokenizer):
        whole, whole_stats = self._train(tokenizer)
        model = _fresh_model(tokenizer)
        calls = []
        model.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
        stats = train_causal_lm(model, tokenizer, EXAMPLES, **self.SHORT, gradient_checkpointing=True)
        assert stats.losses == pytest.approx(whole_stats.losses, abs=1e-6)
        assert self._max_diff(whole, _state(model)) < 1e-6
        assert len(calls) == 2 * self.SHORT["steps"]  # recomputed in every backward: checkpointing was on
        assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        assert model.config.use_cache and not model.training and not hasattr(model, "_require_grads_hook")

    def test_encode_prompt_decides_the_prompt_tokens(self, tokenizer):
        example = EXAMPLES[0]
        wrapped = lambda prompt: tokenizer("<|user|>" + prompt, add_special_tokens=True)["input_ids"]  # noqa: E731
        input_ids, labels = encode_example(tokenizer, example, wrapped)
        prompt = wrapped(example.prompt)
        assert input_ids[: len(prompt)] == prompt and labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
        completion = tokenizer(example.completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert input_ids[len(prompt):] == labels[len(prompt):] == completion
        assert len(prompt) > len(encode_example(tokenizer, example)[0]) - len(completion)  # not the default


# Short and long examples, so that several short ones share a packed row.
MIXED = [Example(e.prompt * 3, e.completion * 3) if i % 4 == 0 else e for i, e in enumerate(EXAMPLES)]


class TestPacking:
    SHORT = dict(steps=6, batch_size=16, lr=5e-3, warmup_steps=1, seed=0)

    def test_rows_hold_every_example_once_within_the_width(self):
        lengths = [random.Random(n).randint(1, 40) for n in range(60)]
        rows = pack_rows(lengths, 40)
        assert sorted(i for row in rows for i in row) == list(range(60))
        assert all(sum(lengths[i] for i in row) <= 40 for row in rows)
        assert len(rows) < 60 and pack_rows(lengths, 40) == rows  # it packs, and always the same way

    def test_a_packed_batch_restarts_positions_and_never_labels_an_example_s_first_token(self, tokenizer):
        rows = [encode_example(tokenizer, e) for e in MIXED[:6]]
        packed = packed_batch(rows, pad_id=tokenizer.pad_token_id)
        assert "attention_mask" not in packed  # transformers reads packed sequences off the positions
        width = max(len(ids) for ids, _ in rows)
        assert packed["input_ids"].shape[1] == width and packed["input_ids"].shape[0] < len(rows)
        ids, positions, labels = (packed[k].flatten().tolist() for k in ("input_ids", "position_ids", "labels"))
        starts = [j for j, p in enumerate(positions) if p == 0]
        assert all(labels[j] == IGNORE_INDEX for j in starts)
        targets = sorted(t for t in labels if t != IGNORE_INDEX)
        assert targets == sorted(t for _, lab in rows for t in lab[1:] if t != IGNORE_INDEX)

    def test_the_packed_loss_and_gradients_are_the_padded_ones(self, tokenizer):
        model = _fresh_model(tokenizer)
        rows = [encode_example(tokenizer, e) for e in MIXED[:16]]
        results = []
        for inputs in (padded_batch(rows, tokenizer.pad_token_id), packed_batch(rows, tokenizer.pad_token_id)):
            model.zero_grad()
            loss = model(**inputs, use_cache=False).loss
            loss.backward()
            results.append((float(loss.detach()), [p.grad.clone() for p in model.parameters()]))
        (padded, padded_grads), (packed, packed_grads) = results
        assert packed == pytest.approx(padded, rel=1e-5)
        assert max(float((a - b).abs().max()) for a, b in zip(padded_grads, packed_grads)) < 1e-5
        packed_inputs, padded_inputs = packed_batch(rows, tokenizer.pad_token_id), padded_batch(rows, 0)
        assert packed_inputs["input_ids"].numel() < padded_inputs["input_ids"].numel()

    def test_training_packed_matches_training_padded_and_computes_fewer_positions(self, tokenizer):
        runs = {}
        for pack in (False, True):
            model = _fresh_model(tokenizer)
            stats = train_causal_lm(model, tokenizer, MIXED, **self.SHORT, pack=pack)
            runs[pack] = (_state(model), stats)
        (padded_state, padded), (packed_state, packed) = runs[False], runs[True]
        assert packed.packed and not padded.packed
        assert packed.losses == pytest.approx(padded.losses, rel=1e-4)
        assert packed.tokens == padded.tokens and packed.positions < padded.positions
        assert packed.padding_share < padded.padding_share
        assert max(float((packed_state[k] - padded_state[k]).abs().max()) for k in packed_state) < 1e-4

    def test_a_model_that_ignores_packed_positions_trains_padded(self, tokenizer):
        """A model whose forward drops the position ids would let packed examples attend to each
        other: the first batch's loss check catches it, and training runs padded, as the plain run."""
        import torch

        class IgnoresPositions(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner, self.config = inner, inner.config

            @property
            def device(self):
                return self.inner.device

            def forward(self, position_ids=None, **kwargs):
                return self.inner(**kwargs)

        plain = _fresh_model(tokenizer)
        expected = train_causal_lm(plain, tokenizer, MIXED, **self.SHORT, pack=False)
        wrapped = IgnoresPositions(_fresh_model(tokenizer))
        stats = train_causal_lm(wrapped, tokenizer, MIXED, **self.SHORT)
        assert not stats.packed and stats.positions == expected.positions
        assert stats.losses == expected.losses


class TestMixedPrecision:
    """train.mixed_precision: bfloat16 autocast over float32 weights, where the device has it natively."""

    def test_bf16_learns_as_float32_does_and_keeps_float32_weights(self, tokenizer, trained):
        import torch

        _, float32 = trained
        model = _fresh_model(tokenizer)
        stats = train_causal_lm(model, tokenizer, EXAMPLES, **TRAIN, bf16=True)
        assert stats.bf16 and not float32.bf16
        assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay float32
        assert stats.losses != float32.losses  # the forwards really ran in bfloat16
        assert stats.first_loss == pytest.approx(float32.first_loss, rel=0.02)
        assert sum(stats.losses[-10:]) / 10 < 0.02 * stats.first_loss  # and it learned as well

    def test_bf16_training_is_deterministic(self, tokenizer):
        states = []
        for _ in range(2):
            model = _fresh_model(tokenizer)
            train_causal_lm(model, tokenizer, EXAMPLES[:20], steps=5, batch_size=8, lr=5e-3, warmup_steps=1,
                            seed=3, bf16=True)
            states.append(_state(model))
        assert _same(*states)

    @pytest.mark.parametrize("setting", ["fp32", "bf16", "auto"])
    def test_the_setting_resolves_per_device(self, tokenizer, setting):
        import torch

        from closedloop.training.causal_lm import use_bf16

        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        assert use_bf16(setting, _fresh_model(tokenizer)) == {"fp32": False, "bf16": True, "auto": native}[setting]

    def test_an_unknown_setting_is_refused_naming_the_key(self):
        from closedloop.config import ConfigError, parse_params

        with pytest.raises(ConfigError, match="train.mixed_precision"):
            parse_params({"train": {"mixed_precision": "fp16"}})

    def test_off_written_in_yaml_is_answered_with_what_to_write(self, tmp_path):
        from closedloop.config import ConfigError, load_params

        (tmp_path / "params.yaml").write_text("train:\n  mixed_precision: off\n")
        with pytest.raises(ConfigError, match=r"(?s)params.yaml.*train.mixed_precision.*YAML boolean false.*write fp32"):
            load_params(tmp_path)


@pytest.mark.gpu
def test_a_bfloat16_training_step_on_cuda(tokenizer):
    """On a GPU the model trains in bfloat16 with the loss in float32, micro-batched and checkpointed."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    model = _fresh_model(tokenizer).to("cuda", torch.bfloat16)
    stats = train_causal_lm(model, tokenizer, EXAMPLES, steps=20, batch_size=16, lr=5e-3, warmup_steps=2, seed=0,
                            micro_batch_size=4, gradient_checkpointing=True)
    assert next(model.parameters()).dtype == torch.bfloat16 and model.device.type == "cuda"
    assert all(math.isfinite(x) for x in stats.losses) and stats.losses[-1] < stats.losses[0]
