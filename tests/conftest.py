"""Shared fixtures: tiny params, a real workspace (git + DVC) in a temp dir, a real Prefect API."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see closedloop/cli.py: spinning threads collapse under load
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.pop("MLFLOW_TRACKING_URI", None)

TINY = {
    "project": {"seed": 7},
    "model": {"builtin": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
                          "vocab_size": 320, "max_position_embeddings": 512}},
    # Every environment, each with a benchmark of 2 core, 1 edge and 1 failure-mode task.
    "envs": {name: {"benchmark": {"core": 2, "edge": 1, "failure_modes": 1}, **extra}
             for name, extra in (("code", {"tests_per_task": 4}), ("data", {}), ("script", {}),
                                 ("extract", {}), ("rules", {}))},
    "generate": {"n_tasks": 10},
    "sample": {"k": 2, "max_new_tokens": 24, "batch_size": 16},
    "reward": {"workers": 2},
    "warmstart": {"n_references": 16, "steps": 4, "batch_size": 8, "tokenizer_corpus_tasks": 120},
    "train": {"steps": 2, "batch_size": 8},
    "evaluate": {"samples_per_task": 1, "batch_size": 16},
}


def tiny_params(**overrides):
    from closedloop.config import parse_params

    import copy

    data = copy.deepcopy(TINY)
    for key, value in overrides.items():
        data.setdefault(key, {}).update(value)
    return parse_params(data)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh closedloop workspace with tiny params: real git, real DVC, a local DVC remote."""
    import yaml

    from closedloop.scaffold import init_workspace

    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    init_workspace(root)
    return root


@pytest.fixture(scope="session")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine, two threads that wait on each other made tiny
    models up to 10x slower whenever another process was busy; results do not depend on it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
