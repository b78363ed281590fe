"""The vllm backend (offline vllm.LLM) and the hf backend on CUDA: run only where CUDA (and vLLM) exist.

No machine this project has can run vLLM (see docs/your-model.md); these tests
are written against vLLM's documented API and skip elsewhere.
"""

from __future__ import annotations

import copy

import pytest

from closedloop.config import parse_params
from tests.conftest import TINY
from tests.stages.test_openai_backend import PROMPTS, model_dir  # noqa: F401  (the fixture)

pytestmark = pytest.mark.gpu


def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")


def _params(**sample):
    data = copy.deepcopy(TINY)
    data["sample"].update({"max_new_tokens": 16, "stop": ["\ndef "], **sample})
    data["model"] = {**data["model"], "device": "cuda"}
    return parse_params(data)


def _sample(params, directory, k=2, seed=5):
    from closedloop.sampling.base import open_sampler

    with open_sampler(params, directory) as sampler:
        return sampler.sample(PROMPTS, k=k, seed=seed, batch_size=8)[0]


def test_vllm_greedy_texts_equal_the_hf_backend(model_dir):  # noqa: F811
    _cuda()
    pytest.importorskip("vllm")
    local = _sample(_params(temperature=0), model_dir)
    engine = _sample(_params(temperature=0, backend={"name": "vllm", "gpu_memory_utilization": 0.2,
                                                     "enforce_eager": True}), model_dir)
    assert [[c.text for c in row] for row in engine] == [[c.text for c in row] for row in local]


def test_vllm_returns_processed_logprobs_close_to_the_trainers(model_dir):  # noqa: F811
    _cuda()
    pytest.importorskip("vllm")
    import torch

    from closedloop.models.loading import load_policy

    rows = _sample(_params(temperature=0.7, backend={"name": "vllm", "gpu_memory_utilization": 0.2,
                                                     "enforce_eager": True}), model_dir)
    model, tokenizer = load_policy(model_dir, device="cuda", dtype="float32")
    completion = rows[0][0]
    assert completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids)
    prompt = tokenizer(PROMPTS[0])["input_ids"]
    ids = torch.tensor([prompt + list(completion.token_ids)], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
    mine = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt):, None]).squeeze(1)
    assert torch.allclose(mine.cpu(), torch.tensor(completion.logprobs), atol=1e-2)


def test_hf_backend_samples_on_cuda_in_bfloat16(model_dir):  # noqa: F811
    _cuda()
    data = _params(temperature=1.0)
    params = parse_params({**data.model_dump(mode="json"), "model": {**data.model.model_dump(mode="json"),
                                                                      "dtype": "bfloat16"}})
    rows = _sample(params, model_dir, k=3)
    assert [len(row) for row in rows] == [3] * len(PROMPTS)
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for row in rows for c in row)
