"""The openai backend against a real OpenAI-compatible server: `transformers serve` on a tiny model (CPU)."""

from __future__ import annotations

import copy
import socket
import time
from pathlib import Path

import pytest

from closedloop.config import parse_params
from closedloop.sampling.base import SamplingError, open_sampler
from tests.conftest import TINY

PROMPTS = [f"# Return the {op} of xs, case {i}.\ndef f(xs):\n" for i in range(3) for op in ("sum", "largest")]


def _params(**sample):
    data = copy.deepcopy(TINY)
    data["sample"].update({"max_new_tokens": 16, "stop": ["\ndef "], **sample})
    return parse_params(data)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny builtin-architecture model trained a little, so greedy decoding writes varied text."""
    from closedloop.config import BuiltinModelParams
    from closedloop.models.builtin import build_builtin_model, train_tokenizer
    from closedloop.models.loading import save_policy
    from closedloop.training.causal_lm import Example, train_causal_lm

    examples = [Example(f"# Return the {op} of xs, case {i}.\ndef f(xs):\n", f"    return {expr}(xs)\n\ndef g():\n")
                for i in range(6) for op, expr in (("sum", "sum"), ("largest", "max"), ("length", "len"))]
    config = BuiltinModelParams(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=320,
                                max_position_embeddings=128)
    tokenizer = train_tokenizer([e.prompt + e.completion for e in examples], config.vocab_size)
    model = build_builtin_model(config, tokenizer, seed=0)
    train_causal_lm(model, tokenizer, examples, steps=60, batch_size=9, lr=3e-3, warmup_steps=5, seed=0)
    out = tmp_path_factory.mktemp("served") / "model"
    save_policy(model, tokenizer, out)
    return out


@pytest.fixture(scope="module")
def server(model_dir):
    """One managed `transformers serve` process for the module (it starts in a few seconds)."""
    from closedloop.sampling.server import start_server

    process = start_server(model_dir, _params(backend="openai", server={"managed": True}))
    yield process
    process.stop()


def _sample(params, model_dir, k=2, seed=5):
    with open_sampler(params, model_dir) as sampler:
        return sampler.sample(PROMPTS, k=k, seed=seed, batch_size=8)[0], sampler


class TestAgainstTransformersServe:
    def test_greedy_texts_equal_the_hf_backend(self, model_dir, server):
        local, _ = _sample(_params(temperature=0), model_dir)
        remote, sampler = _sample(_params(temperature=0, backend="openai", server={"url": server.url}), model_dir)
        assert [[c.text for c in row] for row in remote] == [[c.text for c in row] for row in local]
        assert [[c.finish_reason for c in row] for row in remote] == [[c.finish_reason for c in row] for row in local]
        assert any(c.text.strip() for row in local for c in row)  # the model writes something to compare
        assert not sampler.capabilities.logprobs and all(c.logprobs is None for row in remote for c in row)

    def test_sampling_is_seeded_and_k_requests_give_k_samples(self, model_dir, server):
        params = _params(temperature=1.0, backend={"name": "openai", "concurrency": 1}, server={"url": server.url})
        first, _ = _sample(params, model_dir, k=3, seed=11)
        again, _ = _sample(params, model_dir, k=3, seed=11)
        assert [len(row) for row in first] == [3] * len(PROMPTS)
        assert [[c.text for c in row] for row in first] == [[c.text for c in row] for row in again]
        assert len({c.text for row in first for c in row}) > 1  # it sampled, not decoded greedily

    def test_a_server_that_serves_another_model_is_refused(self, model_dir, server, tmp_path):
        import shutil

        other = tmp_path / "other-model"
        shutil.copytree(model_dir, other)
        with pytest.raises(SamplingError, match="serves .* not the model being sampled") as error:
            open_sampler(_params(backend="openai", server={"url": server.url}), other)
        assert server.url in str(error.value)
        with pytest.raises(SamplingError, match="expected one of \\['someone-else'\\]"):
            open_sampler(_params(backend="openai", server={"url": server.url, "model": "someone-else"}), model_dir)

    def test_a_request_that_outlives_its_timeout_fails_naming_the_url(self, model_dir, server):
        params = _params(temperature=0, max_new_tokens=120, backend={"name": "openai", "timeout_s": 0.001,
                                                                      "retries": 1, "backoff_s": 0.01},
                         server={"url": server.url})
        with pytest.raises(SamplingError, match="no answer within 0.001 s") as error:
            _sample(params, model_dir, k=1)
        assert f"{server.url}/" in str(error.value)


def test_a_dead_server_fails_naming_the_url(model_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    params = _params(backend={"name": "openai", "retries": 2, "backoff_s": 0.01}, server={"url": url})
    started = time.monotonic()
    with pytest.raises(SamplingError, match="cannot reach the inference server") as error:
        open_sampler(params, model_dir)
    assert url in str(error.value) and "3 attempt(s)" in str(error.value)
    assert time.monotonic() - started < 10


def test_a_managed_server_is_stopped_when_the_sampler_closes(model_dir):
    with open_sampler(_params(temperature=0, backend="openai", server={"managed": True}), model_dir) as sampler:
        process = sampler.process.process
        assert sampler.sample(PROMPTS[:1], k=1, seed=0, batch_size=1)[0][0][0].finish_reason in ("eos", "stop", "length")
    assert process.poll() is not None  # no server left behind


def test_a_managed_server_dies_with_a_killed_stage(model_dir, tmp_path):
    """SIGKILL leaves no cleanup to run: the kernel must end the server (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "stage.py"
    script.write_text(
        "import sys, time\n"
        "from closedloop.config import parse_params\n"
        "from closedloop.sampling.server import start_server\n"
        f"server = start_server({str(model_dir)!r}, parse_params({{'sample': {{'backend': 'openai', "
        "'server': {'managed': True}}}))\n"
        "print(server.process.pid, flush=True)\n"
        "time.sleep(600)\n")
    stage = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server_pid = int(stage.stdout.readline())
    os.kill(stage.pid, signal.SIGKILL)
    stage.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(server_pid, signal.SIGKILL)
    raise AssertionError("the managed server outlived the killed stage")
