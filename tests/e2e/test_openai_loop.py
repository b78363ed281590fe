"""A whole iteration sampled through a managed OpenAI-compatible server (`transformers serve`, CPU)."""

from __future__ import annotations

import copy
import subprocess

import pytest
import yaml

from closedloop.io import read_json, read_jsonl
from tests.e2e.test_cli_loop import cli, lock_outs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    from tests.conftest import TINY

    params = copy.deepcopy(TINY)
    params["sample"].update({"backend": "openai", "server": {"managed": True}})
    root = tmp_path_factory.mktemp("openai") / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cli("closedloop", "init", str(root), cwd=root)
    result = cli("closedloop", "run", "--iterations", "1", "--no-progress", cwd=root)
    return root, result


def test_an_iteration_samples_and_evaluates_through_the_managed_server(ran):
    root, result = ran
    assert "iteration 1" in result.stdout and "vs champion" in result.stdout, result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    samples = read_jsonl(root / "data/batch/samples.jsonl")
    assert samples and {s["backend"] for s in samples} == {"openai"}
    # The server gives no log-probabilities: the rollouts say so, and the trainer is the one to fill them.
    rollouts = read_jsonl(root / "data/batch/rollouts.jsonl")
    assert all(r["logprobs"] is None and r["token_ids"] for r in rollouts)
    assert read_json(root / "metrics/info/sample.json")["logprobs_from"] == "trainer"
    evaluation = read_json(root / "data/reports/evaluation.json")
    assert set(evaluation) == {"champion", "candidate"}
    # Every managed server was stopped with its stage.
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in procs.splitlines() if "serve" in line and str(root) in line]


def test_dvc_repro_has_nothing_to_do_afterwards(ran):
    root, _ = ran
    assert "up to date" in cli("dvc", "status", cwd=root).stdout
    before = lock_outs(root)
    repro = cli("dvc", "repro", cwd=root).stdout
    assert "Running stage" not in repro, repro
    assert lock_outs(root) == before
