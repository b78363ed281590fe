"""JSONL task sets: loading with line/field errors, `closedloop tasks export`, and `closedloop verify`
on the tasks of any environment."""

from __future__ import annotations

import json

import pytest

from closedloop.cli import main
from closedloop.envs.humaneval import TaskFileError
from closedloop.envs.taskfile import load_task_file, task_from_record
from closedloop.io import read_jsonl

GOOD = {"task_id": "rules/train/1", "env": "rules", "split": "train", "slice": "core", "kind": "k",
        "prompt": "p\n", "entry_point": "", "checks": {"a": 1}, "reference": "r\n"}


@pytest.mark.parametrize("change, message", [
    ({"checks": "oops"}, "field 'checks' must be an object"),
    ({"prompt": ""}, "field 'prompt' must be a non-empty string"),
    ({"slice": "hard"}, "field 'slice' must be one of ['core', 'edge', 'failure_modes', 'heldout']"),
    ({"split": "test"}, "field 'split' must be one of ['train', 'benchmark']"),
    ({"extra": 1}, "unknown field(s) ['extra']"),
    ({"env": "code"}, "field 'env' is 'code', but this file is read as 'rules' tasks"),
])
def test_a_bad_record_names_the_field(change, message):
    with pytest.raises(TaskFileError) as error:
        task_from_record({**GOOD, **change}, "tasks.jsonl:3", env="rules")
    assert str(error.value).startswith("tasks.jsonl:3: ") and message in str(error.value)


def test_a_missing_field_is_named():
    record = dict(GOOD)
    del record["reference"]
    with pytest.raises(TaskFileError, match="tasks.jsonl:1: missing field 'reference'"):
        task_from_record(record, "tasks.jsonl:1")


def test_the_file_names_the_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + "{not json\n")
    with pytest.raises(TaskFileError, match=rf"{path}:3: not valid JSON"):
        load_task_file(path)
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(TaskFileError, match=rf"{path}:2: task 'rules/train/1': field 'task_id' repeats line 1"):
        load_task_file(path)


@pytest.mark.parametrize("env", ["code", "data", "script", "extract", "rules"])
def test_export_then_verify_references_round_trip(tmp_path, capsys, env):
    """Exported tasks carry their references; verifying those references scores every one passed."""
    tasks_path, samples_path, out = tmp_path / "tasks.jsonl", tmp_path / "samples.jsonl", tmp_path / "out.jsonl"
    assert main(["tasks", "export", "--env", env, "--split", "edge", "--n", "6", "--out", str(tasks_path)]) == 0
    tasks = read_jsonl(tasks_path)
    assert len(tasks) == 6 and {t["env"] for t in tasks} == {env} and {t["slice"] for t in tasks} == {"edge"}
    assert [t.task_id for t in load_task_file(tasks_path, env)] == [t["task_id"] for t in tasks]
    wrong = "not an answer at all\n"
    samples = [{"task_id": t["task_id"], "completion": t["reference"]} for t in tasks]
    samples += [{"task_id": t["task_id"], "completion": wrong} for t in tasks]
    samples_path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert main(["verify", "--tasks", str(tasks_path), "--samples", str(samples_path), "--out", str(out)]) == 0
    rows = read_jsonl(out)
    assert [r["passed"] for r in rows] == [True] * 6 + [False] * 6
    assert all(r["env"] == env and r["reward"] == 1.0 for r in rows[:6])
    assert all(r["failed_step"] and r["reward"] < 1.0 for r in rows[6:])
    assert "pass@1 0.500" in capsys.readouterr().out


def test_verify_mixed_environments_in_one_file(tmp_path, capsys):
    tasks_path, samples_path, out = tmp_path / "tasks.jsonl", tmp_path / "samples.jsonl", tmp_path / "out.jsonl"
    tasks = []
    for env in ("code", "rules", "extract"):
        part = tmp_path / f"{env}.jsonl"
        assert main(["tasks", "export", "--env", env, "--split", "train", "--n", "3", "--out", str(part)]) == 0
        tasks += read_jsonl(part)
    tasks_path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    samples_path.write_text("".join(json.dumps({"task_id": t["task_id"], "completion": t["reference"]}) + "\n"
                                    for t in tasks))
    assert main(["verify", "--tasks", str(tasks_path), "--samples", str(samples_path), "--out", str(out)]) == 0
    assert [r["env"] for r in read_jsonl(out)] == [t["env"] for t in tasks]
    assert "pass rate per environment: code 1.000, extract 1.000, rules 1.000" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--env", "chess", "--split", "train", "--n", "3"], "unknown environment 'chess'"),
    (["--env", "code", "--split", "train", "--n", "0"], "--n must be at least 1"),
])
def test_export_refuses_bad_arguments_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "tasks.jsonl"
    assert main(["tasks", "export", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_verify_refuses_an_unknown_environment(tmp_path, capsys):
    tasks_path, samples_path, out = tmp_path / "tasks.jsonl", tmp_path / "samples.jsonl", tmp_path / "out.jsonl"
    tasks_path.write_text(json.dumps({**GOOD, "env": "chess"}) + "\n")
    samples_path.write_text(json.dumps({"task_id": GOOD["task_id"], "completion": "x"}) + "\n")
    assert main(["verify", "--tasks", str(tasks_path), "--samples", str(samples_path), "--out", str(out)]) == 2
    assert "unknown environment 'chess'" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("change, message", [
    ({"entry_point": ""}, "field 'entry_point' must name the function to call"),
    ({"checks": {"calls": [[1]], "expected": []}}, "checks.expected must hold one value per call (1), got 0"),
    ({"checks": {"expected": [1]}}, "checks is missing 'calls' (or give 'test'"),
])
def test_code_tasks_from_a_file_are_checked_for_the_environment(tmp_path, change, message):
    """A code task the sandbox could not run is refused at load, naming the line, not at verify time."""
    from closedloop.envs.taskfile import load_any

    good = {**GOOD, "task_id": "code/x/1", "env": "code", "entry_point": "f",
            "checks": {"calls": [[1]], "expected": [2]}, "reference": "    return x + 1\n"}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "task_id": "code/x/2", **change}) + "\n")
    with pytest.raises(TaskFileError) as error:
        load_any(path, "code")
    assert f"{path}:2: task 'code/x/2': {message}" in str(error.value)
    path.write_text(json.dumps(good) + "\n")
    assert [t.task_id for t in load_any(path, "code")] == ["code/x/1"]


def test_verify_refuses_a_code_task_it_could_not_run(tmp_path, capsys):
    tasks_path, samples_path, out = tmp_path / "tasks.jsonl", tmp_path / "samples.jsonl", tmp_path / "out.jsonl"
    bad = {**GOOD, "task_id": "code/x/1", "env": "code", "entry_point": "", "checks": {"calls": [[1]], "expected": [2]}}
    tasks_path.write_text(json.dumps(bad) + "\n")
    samples_path.write_text(json.dumps({"task_id": "code/x/1", "completion": "x"}) + "\n")
    assert main(["verify", "--tasks", str(tasks_path), "--samples", str(samples_path), "--out", str(out)]) == 2
    assert f"{tasks_path}:1: task 'code/x/1': field 'entry_point'" in capsys.readouterr().err and not out.exists()
