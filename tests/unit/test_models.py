"""The built-in tokenizer and model, and loading, saving and fingerprinting of model directories."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from closedloop.config import BuiltinModelParams
from closedloop.models.builtin import build_builtin_model, create_builtin, train_tokenizer
from closedloop.models.loading import ModelLoadError, load_policy, model_fingerprint, save_policy

# One torch thread for these tiny models (see tests/conftest.py: one_torch_thread).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = BuiltinModelParams(
    hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=320, max_position_embeddings=128
)
OPS = {"sum": "sum(xs)", "largest number": "max(xs)", "even numbers": "[x for x in xs if x % 2 == 0]"}
CORPUS = [
    f"# Return the {op} of xs plus {n}.\ndef f(xs):\n    return {expr} + {n}\n"
    for n in range(20)
    for op, expr in OPS.items()
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, TINY.vocab_size)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return create_builtin(TINY, CORPUS, tmp_path_factory.mktemp("builtin") / "model", seed=3)


def _state_equal(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class TestTrainTokenizer:
    @pytest.mark.parametrize(
        "text",
        [
            CORPUS[0],  # in-corpus code
            "def g(x):\n    if x:\n        return [\n            x,\n        ]\n",  # deep indentation
            "\tx = 1\n\n\n  \ty = 2  \n",  # tabs, blank lines, trailing spaces
            "s = 'héllo wörld ✓ 日本語 🐍'\n",  # unicode never seen in the corpus
            " leading space and no trailing newline",
            "\x00\x7f odd bytes\r\n",  # control characters and CRLF survive byte-level BPE
            "",
        ],
    )
    def test_round_trip_is_exact(self, tokenizer, text):
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text

    def test_special_tokens(self, tokenizer):
        ids = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
        assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
        assert len(ids) == 3 and None not in ids
        plain = tokenizer("x = 1", add_special_tokens=False)["input_ids"]
        assert tokenizer("x = 1", add_special_tokens=True)["input_ids"] == [tokenizer.bos_token_id] + plain

    def test_vocab_size_is_an_upper_bound(self, tokenizer):
        assert 256 < len(tokenizer) <= TINY.vocab_size

    def test_deterministic(self, tokenizer):
        again = train_tokenizer(CORPUS, TINY.vocab_size)
        assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()

    def test_common_code_compresses(self, tokenizer):
        # The BPE merges must be learnt from the corpus, not a bare byte alphabet.
        text = CORPUS[5]
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) < len(text.encode()) / 2

    def test_split_digits_gives_each_digit_its_own_token_in_every_context(self):
        """Without it BPE merges frequent digit runs ("1", "12", " 1"), so a number copied from a
        prompt into JSON is a different token sequence depending on what precedes it."""
        corpus = CORPUS + [f"total: {n * 37}.5 and {n}\n" for n in range(200)]
        split = train_tokenizer(corpus, TINY.vocab_size, split_digits=True)
        merged = train_tokenizer(corpus, TINY.vocab_size, split_digits=False)

        def pieces(tok, text):
            return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]

        for text in ("Total: 807.63 GBP", '{"total": 807.63}', "x=807"):
            digits = [p for p in pieces(split, text) if any(c.isdigit() for c in p)]
            assert digits == list("80763" if "." in text else "807"), digits
            assert split.decode(split(text, add_special_tokens=False)["input_ids"]) == text
        assert any(len([c for c in p if c.isdigit()]) > 1 for p in pieces(merged, "total: 1110.5 and 12"))


class TestBuildBuiltinModel:
    def test_config_follows_params(self, tokenizer):
        model = build_builtin_model(TINY, tokenizer, seed=0)
        config = model.config
        assert type(model).__name__ == "LlamaForCausalLM"
        assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (32, 2, 2)
        assert config.num_key_value_heads == 2 and config.intermediate_size == 64
        assert config.max_position_embeddings == 128
        assert config.vocab_size == len(tokenizer)
        assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
        for ids in (config, model.generation_config):
            assert (ids.bos_token_id, ids.eos_token_id, ids.pad_token_id) == (
                tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
            )
        assert not model.training

    def test_default_size_is_about_two_million_parameters(self):
        class SixHundred:  # only len() of the tokenizer sizes the model
            bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

            def __len__(self):
                return 600

        model = build_builtin_model(BuiltinModelParams(), SixHundred(), seed=0)
        assert 1.9e6 < sum(p.numel() for p in model.parameters()) < 2.2e6

    def test_seed_decides_the_weights(self, tokenizer):
        a, b, c = (build_builtin_model(TINY, tokenizer, seed=s) for s in (1, 1, 2))
        assert _state_equal(a, b)
        assert not _state_equal(a, c)

    def test_does_not_touch_the_global_random_stream(self, tokenizer):
        import torch

        torch.manual_seed(0)
        expected = torch.rand(3)
        torch.manual_seed(0)
        build_builtin_model(TINY, tokenizer, seed=5)
        assert torch.equal(torch.rand(3), expected)


class TestCreateBuiltin:
    def test_is_a_standard_llama_directory(self, model_dir):
        names = {p.name for p in model_dir.iterdir()}
        assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json"} <= names
        config = json.loads((model_dir / "config.json").read_text())
        assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
        # The transformers 4.x name of the generic fast tokenizer (vLLM pins 4.x in many builds).
        assert json.loads((model_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == (
            "PreTrainedTokenizerFast"
        )

    def test_loads_with_auto_classes(self, model_dir, tokenizer):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        loaded_tokenizer = AutoTokenizer.from_pretrained(model_dir)
        assert _state_equal(model, build_builtin_model(TINY, tokenizer, seed=3))
        text = CORPUS[7] + "  # ünïcode\n"
        assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
        assert loaded_tokenizer.decode(loaded_tokenizer(text)["input_ids"], skip_special_tokens=True) == text

    def test_reproducible_byte_for_byte(self, model_dir, tmp_path):
        time.sleep(1.1)  # a timestamp in any file would now differ
        again = create_builtin(TINY, CORPUS, tmp_path / "again", seed=3)
        assert model_fingerprint(again) == model_fingerprint(model_dir)


class TestLoadPolicy:
    def test_loads_for_generation(self, model_dir):
        import torch

        model, tokenizer = load_policy(model_dir)
        assert model.dtype == torch.float32 and not model.training
        assert next(model.parameters()).device.type == "cpu"
        assert tokenizer.padding_side == "left"
        assert load_policy(str(model_dir))[1].pad_token == "<pad>"

    def test_missing_pad_token_falls_back_to_eos(self, model_dir, tmp_path):
        model, tokenizer = load_policy(model_dir)
        save_policy(model, tokenizer, tmp_path)
        config_path = tmp_path / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        del config["pad_token"]
        config_path.write_text(json.dumps(config))
        _, tokenizer = load_policy(tmp_path)
        assert tokenizer.pad_token == tokenizer.eos_token == "</s>"

    @pytest.mark.parametrize(
        "name, message",
        [
            ("builtin:tiny", "resolve builtin models"),  # callers resolve builtins to a directory
            ("./no/such/model", "does not exist"),  # a path, not a hub id
            ("/no/such/model", "does not exist"),
        ],
    )
    def test_rejects_what_it_cannot_load(self, name, message):
        with pytest.raises(ModelLoadError, match=message):
            load_policy(name)

    def test_directory_without_config(self, tmp_path):
        with pytest.raises(ModelLoadError, match="no config.json"):
            load_policy(tmp_path)

    def test_uncached_hub_id_offline_names_the_id(self, monkeypatch, tmp_path):
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
        with pytest.raises(ModelLoadError, match="closedloop-test/no-such-model"):
            load_policy("closedloop-test/no-such-model")


class TestSavePolicy:
    def test_load_save_round_trip_is_byte_identical(self, model_dir, tmp_path):
        model, tokenizer = load_policy(model_dir)
        save_policy(model, tokenizer, tmp_path / "a")
        model, tokenizer = load_policy(tmp_path / "a")
        save_policy(model, tokenizer, tmp_path / "b")
        files = sorted(p.name for p in (tmp_path / "a").iterdir())
        assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
        for name in files:
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
        assert model_fingerprint(tmp_path / "a") == model_fingerprint(model_dir)

    def test_keeps_the_callers_padding_side(self, model_dir, tmp_path):
        model, tokenizer = load_policy(model_dir)
        save_policy(model, tokenizer, tmp_path)
        assert tokenizer.padding_side == "left"


class TestModelFingerprint:
    def test_changes_when_weights_change(self, model_dir, tmp_path):
        import torch

        model, tokenizer = load_policy(model_dir)
        with torch.no_grad():
            model.model.norm.weight[0] += 1e-3
        save_policy(model, tokenizer, tmp_path)
        assert model_fingerprint(tmp_path) != model_fingerprint(model_dir)

    @pytest.mark.parametrize(
        "files_a, files_b, same",
        [
            ({"a": b"1", "b": b"2"}, {"b": b"2", "a": b"1"}, True),  # creation order does not matter
            ({"a": b"1"}, {"a": b"2"}, False),  # content
            ({"a": b"1"}, {"c": b"1"}, False),  # name
            ({"a": b"1"}, {"a": b"1", "b": b""}, False),  # an extra empty file
            ({"ab": b"c"}, {"a": b"bc"}, False),  # bytes moved between name and content
            ({"d/a": b"1"}, {"a": b"1"}, False),  # sub-directories count
        ],
    )
    def test_table(self, tmp_path, files_a, files_b, same):
        for side, files in (("A", files_a), ("B", files_b)):
            for name, data in files.items():
                path = tmp_path / side / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        fingerprint = model_fingerprint(tmp_path / "A")
        assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
        assert (fingerprint == model_fingerprint(tmp_path / "B")) is same


class TestDeviceAndDtype:
    @pytest.fixture(scope="class")
    def bf16_dir(self, model_dir, tmp_path_factory):
        """The builtin saved in bfloat16, as most published models are."""
        import torch

        model, tokenizer = load_policy(model_dir)
        out = tmp_path_factory.mktemp("bf16") / "model"
        save_policy(model.to(torch.bfloat16), tokenizer, out)
        return out

    def test_the_builtin_stays_float32_on_the_cpu_and_loads_as_before(self, model_dir):
        import torch

        model, _ = load_policy(model_dir, device="cpu", dtype="auto")
        assert model.dtype == torch.float32 and model.device.type == "cpu"
        assert json.loads((model_dir / "config.json").read_text())["dtype"] == "float32"
        assert _state_equal(model, load_policy(model_dir)[0])

    def test_a_bfloat16_model_loads_and_saves_as_bfloat16(self, bf16_dir, tmp_path):
        import torch
        from safetensors.torch import load_file

        model, tokenizer = load_policy(bf16_dir)
        assert model.dtype == torch.bfloat16
        save_policy(model, tokenizer, tmp_path / "again")
        assert {t.dtype for t in load_file(tmp_path / "again" / "model.safetensors").values()} == {torch.bfloat16}
        assert json.loads((tmp_path / "again" / "config.json").read_text())["dtype"] == "bfloat16"
        assert model_fingerprint(tmp_path / "again") == model_fingerprint(bf16_dir)

    def test_an_explicit_dtype_wins(self, bf16_dir):
        import torch

        assert load_policy(bf16_dir, dtype="float32")[0].dtype == torch.float32

    @pytest.mark.parametrize("config, device, expected", [
        ({"dtype": "bfloat16"}, "cpu", "bfloat16"),  # the model's own, whatever the device
        ({"torch_dtype": "float16"}, "cuda", "float16"),  # the transformers 4.x name
        ({"dtype": "float32"}, "cuda", "float32"),  # the builtin on a GPU
        ({}, "cpu", "float32"),  # none named
        ({}, "cuda", "bfloat16"),
        (None, "cpu", "float32"),
    ])
    def test_auto_dtype(self, config, device, expected):
        import torch

        from closedloop.models.loading import resolve_dtype

        assert resolve_dtype("auto", device, config) == getattr(torch, expected)
        assert resolve_dtype("float16", device, config) == torch.float16

    def test_unknown_values_name_the_key(self):
        from closedloop.models.loading import resolve_device, resolve_dtype

        with pytest.raises(ModelLoadError, match="model.device 'tpu'"):
            resolve_device("tpu")
        with pytest.raises(ModelLoadError, match="model.dtype 'int8'"):
            resolve_dtype("int8")

    def test_auto_device_is_the_cpu_without_cuda_and_cuda_with_it(self):
        import torch

        from closedloop.models.loading import resolve_device

        assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
        assert resolve_device("cpu") == "cpu"

    def test_cuda_without_a_gpu_fails_naming_the_key(self, model_dir):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA GPU")
        with pytest.raises(ModelLoadError, match="model.device is cuda but torch sees no CUDA GPU"):
            load_policy(model_dir, device="cuda")

    @pytest.mark.gpu
    def test_on_cuda_a_model_without_a_dtype_loads_as_bfloat16(self, model_dir, tmp_path):
        import shutil

        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU")
        shutil.copytree(model_dir, tmp_path / "m")
        config = json.loads((tmp_path / "m" / "config.json").read_text())
        del config["dtype"]
        (tmp_path / "m" / "config.json").write_text(json.dumps(config))
        model, _ = load_policy(tmp_path / "m")
        assert model.device.type == "cuda" and model.dtype == torch.bfloat16
        model, _ = load_policy(model_dir)  # the builtin names float32: kept on the GPU too
        assert model.device.type == "cuda" and model.dtype == torch.float32
