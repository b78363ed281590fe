"""`model.name_or_path` also takes a local Hugging Face model directory (and a hub id), not only the builtin."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from closedloop.io import read_json, read_jsonl, replace_dir
from closedloop.stages.common import run_stage
from closedloop.workspace import Workspace
from tests.conftest import TINY


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A standard HF directory (config.json, safetensors, tokenizer files) made without downloads."""
    from closedloop.config import BuiltinModelParams
    from closedloop.models.builtin import create_builtin

    corpus = ["# Return the sum of xs.\ndef f(xs):\n    return sum(xs)\n"] * 50
    out = tmp_path_factory.mktemp("hf") / "my-model"
    create_builtin(BuiltinModelParams(**TINY["model"]["builtin"]), corpus, out, seed=3)
    assert (out / "config.json").exists()
    return out


def _workspace(root: Path, name_or_path: str) -> Path:
    params = {**TINY, "model": {"name_or_path": name_or_path}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


def test_local_directory_warm_starts_and_samples(hf_dir, tmp_path):
    root = _workspace(tmp_path, str(hf_dir))
    run_stage("benchmark", root)
    metrics = run_stage("warmstart", root)
    assert metrics["base_model"] == str(hf_dir)
    ws = Workspace.at(root)
    # The warm start fine-tuned the user's model: same architecture and tokenizer, new weights.
    assert read_json(ws.warmstart_model / "config.json")["hidden_size"] == read_json(hf_dir / "config.json")["hidden_size"]
    assert (ws.warmstart_model / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()
    replace_dir(ws.warmstart_model, ws.champion)
    run_stage("generate", root)
    run_stage("sample", root)
    assert len(read_jsonl(ws.samples)) == TINY["generate"]["n_tasks"] * TINY["sample"]["k"]


@pytest.mark.parametrize("name, says", [
    ("builtin:huge", "unknown builtin 'builtin:huge'"),
    ("/no/such/model", "does not exist"),
])
def test_unusable_model_names_fail_clearly(tmp_path, name, says, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id would otherwise retry the network
    root = _workspace(tmp_path, name)
    run_stage("benchmark", root)
    with pytest.raises(Exception, match=says):
        run_stage("warmstart", root)
    assert not Workspace.at(root).warmstart_model.exists()  # nothing half-written


@pytest.mark.gpu
def test_vllm_loads_the_builtin_directory(hf_dir):
    """The builtin is saved as a standard Llama directory that vLLM serves (run where a GPU exists)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    vllm = pytest.importorskip("vllm")
    llm = vllm.LLM(model=str(hf_dir), dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)
    out = llm.generate(["# Return the sum of xs.\ndef f(xs):\n"], vllm.SamplingParams(max_tokens=8, temperature=0))
    assert out[0].outputs[0].token_ids
