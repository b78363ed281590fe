"""Each environment's hidden checks, checked when a task file is read: a missing or mistyped field is
refused by file, line, task and field (never a traceback, never a results file), and a sample the
sandbox could not run is counted as an infrastructure error, never as a pass."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path
from typing import Any, Literal, TypedDict, Union

import pytest

from closedloop.cli import main
from closedloop.config import Params
from closedloop.envs import ENVIRONMENTS, get_env
from closedloop.envs.humaneval import TaskFileError
from closedloop.envs.taskfile import MAX_REPORTED, load_any, shape_problems, task_check_of
from closedloop.io import read_jsonl
from closedloop.verify import load_tasks, print_summary, summarize


@pytest.fixture(scope="module")
def good() -> dict[str, list[dict[str, Any]]]:
    """Two generated train tasks per environment, as a task file holds them."""
    params = Params()
    return {name: [t.to_record() for t in get_env(name, params).generate(2, 0, "train")] for name in ENVIRONMENTS}


def drop(*keys: str):
    def change(record: dict) -> None:
        checks = record["checks"]
        for key in keys[:-1]:
            checks = checks[key]
        del checks[keys[-1]]
    return change


def _set_start(value: Any):
    def change(record: dict) -> None:
        record["checks"]["start"]["a.txt"] = value
    return change


def _rename_data_file(record: dict) -> None:
    checks = record["checks"]
    checks["files"]["/tmp/data.csv"] = checks["files"].pop("data.csv")
    checks["args"] = ["/tmp/data.csv" if a == "data.csv" else a for a in checks["args"]]


def _bad_operator(record: dict) -> None:
    spec = record["checks"]["spec"]
    attr = next(name for name, value in spec["case"].items() if value is not None)
    spec["rules"][0]["if"] = {"attr": attr, "op": "~", "value": 1}


def _truth_of_wrong_type(record: dict) -> None:
    checks = record["checks"]
    name = next(n for n, prop in checks["schema"]["properties"].items() if "string" in str(prop.get("type")))
    checks["truth"][name] = ["not", "a", "string"]


# (environment, what is changed, what the message says after "file:line: task 'id': ")
ROWS = [
    # code: calls with expected values, or a HumanEval test
    ("code", drop("calls"), "checks is missing 'calls' (or give 'test'"),
    ("code", drop("expected"), "checks is missing 'expected'"),
    ("code", lambda r: r["checks"].update(calls="f(1)"), "checks.calls must be a list, got str"),
    ("code", lambda r: r["checks"]["calls"].__setitem__(0, 5), "checks.calls[0] must be a list, got int"),
    ("code", lambda r: r["checks"]["expected"].pop(), "checks.expected must hold one value per call (6), got 5"),
    ("code", lambda r: r["checks"].update(calls=[], expected=[]), "checks.calls must hold at least one call"),
    ("code", lambda r: r.update(checks={"test": 5}), "checks.test must be a string, got int"),
    ("code", lambda r: r.update(checks={"test": "assert True"}), "checks.test must define check(candidate)"),
    ("code", lambda r: r.update(entry_point="not a name"), "field 'entry_point' must name the function to call"),
    # data: CSV files, the call's arguments, the expected table, how rows are compared
    ("data", drop("expected"), "checks is missing 'expected'"),
    ("data", drop("float_tol"), "checks is missing 'float_tol'"),
    ("data", lambda r: r["checks"]["files"].update({"data.csv": 3}), 'checks.files["data.csv"] must be a string, got int'),
    ("data", _rename_data_file, 'checks.files["/tmp/data.csv"] must be a relative path inside the job directory'),
    ("data", lambda r: r["checks"].update(args=[1]), "checks.args[0] must be a string, got int"),
    ("data", lambda r: r["checks"].update(args=["nope.csv"]), "checks.args[0] 'nope.csv' is not one of checks.files"),
    ("data", drop("expected", "rows"), "checks.expected is missing 'rows'"),
    ("data", lambda r: r["checks"]["expected"]["rows"][0].__setitem__(0, [1]),
     "checks.expected.rows[0][0] must be a boolean, an integer, a number, a string or null, got list"),
    ("data", lambda r: r["checks"]["expected"]["dtypes"].__setitem__(0, "string"),
     "checks.expected.dtypes[0] must be one of ['bool', 'int', 'float', 'str', 'other'], got \"string\""),
    ("data", lambda r: r["checks"]["expected"]["rows"][0].pop(), "checks.expected.rows[0] must hold one cell per column"),
    ("data", lambda r: r["checks"]["expected"]["dtypes"].pop(), "checks.expected.dtypes must hold one dtype per column"),
    ("data", lambda r: r["checks"].update(order="sorted"), "checks.order must be one of ['exact', 'any'], got \"sorted\""),
    ("data", lambda r: r["checks"].update(float_tol="1e-6"), "checks.float_tol must be a number, got str"),
    ("data", lambda r: r["checks"].update(float_tol=True), "checks.float_tol must be a number, got bool"),
    ("data", lambda r: r["checks"].update(float_tol=-1), "checks.float_tol must be >= 0, got -1"),
    ("data", lambda r: r.update(entry_point="main"), "field 'entry_point' must be 'solve' (the driver calls it)"),
    # script: the starting tree and the expected one
    ("script", drop("expected"), "checks is missing 'expected'"),
    ("script", drop("start"), "checks is missing 'start'"),
    ("script", _set_start(7), 'checks.start["a.txt"] must be a string, got int'),  # the user's report: a silent infra_error before
    ("script", _set_start(["a", "b"]), 'checks.start["a.txt"] must be a string, got list'),
    ("script", lambda r: r["checks"].update(expected=["a.txt"]), "checks.expected must be an object, got list"),
    ("script", lambda r: r["checks"]["start"].update({"../up.txt": "x"}),
     'checks.start["../up.txt"] must be a relative path inside the job directory'),
    # extract: a schema check_schema reads, and a truth that satisfies it
    ("extract", drop("schema"), "checks is missing 'schema'"),
    ("extract", drop("truth"), "checks is missing 'truth'"),
    ("extract", lambda r: r["checks"].update(truth=[1]), "checks.truth must be an object, got list"),
    ("extract", lambda r: r["checks"]["schema"].update(oneOf=[]), "checks.schema cannot be used: ValueError: check_schema"),
    ("extract", _truth_of_wrong_type, "checks.truth does not satisfy checks.schema"),
    # rules: a spec the rule engine evaluates
    ("rules", drop("spec"), "checks is missing 'spec'"),
    ("rules", drop("spec", "rules"), "checks.spec is missing 'rules'"),
    ("rules", drop("spec", "case"), "checks.spec is missing 'case'"),
    ("rules", lambda r: r["checks"]["spec"]["rules"][0].update(id=1), "checks.spec.rules[0].id must be a string, got int"),
    ("rules", lambda r: r["checks"]["spec"]["rules"][0].pop("then"), "checks.spec.rules[0] is missing 'then'"),
    ("rules", lambda r: r["checks"]["spec"].update(default=None), "checks.spec.default must be a string, got null"),
    ("rules", lambda r: r["checks"]["spec"].update(rules=[]), "checks.spec.rules must hold at least one rule"),
    ("rules", lambda r: r["checks"]["spec"]["rules"].append(copy.deepcopy(r["checks"]["spec"]["rules"][0])),
     "checks.spec.rules: rule id(s) ['R1'] repeat"),
    ("rules", lambda r: r["checks"]["spec"].update(order=["R9"]), "checks.spec.order must be a list of rule ids"),
    ("rules", _bad_operator, "checks.spec cannot be evaluated: ValueError: rules env: unknown operator '~'"),
]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("env, change, message", ROWS, ids=[f"{row[0]}-{i}" for i, row in enumerate(ROWS)])
def test_a_bad_task_is_refused_by_file_line_task_and_field(tmp_path, capsys, good, env, change, message):
    first, bad = copy.deepcopy(good[env])
    change(bad)
    tasks = _write(tmp_path / "tasks.jsonl", [first, bad])
    samples = _write(tmp_path / "samples.jsonl", [{"task_id": t["task_id"], "completion": t["reference"]}
                                                   for t in (first, bad)])
    params, out = tmp_path / "params.yaml", tmp_path / "results.jsonl"
    params.write_text("{}\n")
    argv = ["verify", "--tasks", str(tasks), "--samples", str(samples), "--out", str(out), "--params", str(params)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tasks}:2: task {bad['task_id']!r}: {message}" in err, err
    assert "Traceback" not in err and str(first["task_id"]) not in err and not out.exists()
    with pytest.raises(TaskFileError, match=f"{tasks}:2: "):  # what the stages read (train_file, benchmark_file)
        load_any(tasks, env)


@pytest.mark.parametrize("env", sorted(ENVIRONMENTS))
def test_every_generated_task_passes_its_environments_check(env):
    """The declarations are not stricter than the generators: no task the loop makes is refused."""
    environment = get_env(env, Params())
    check = task_check_of(type(environment))
    tasks = environment.generate(12, 1, "train")
    tasks += [t for slice in ("core", "edge", "failure_modes") for t in environment.generate(4, 1, "benchmark", slice)]
    assert [(t.task_id, check(t)) for t in tasks if check(t)] == []


def test_every_problem_of_a_file_is_reported_at_once(tmp_path, good):
    records = copy.deepcopy(good["script"] + good["rules"])
    del records[0]["checks"]["expected"]
    records[3]["checks"]["spec"]["default"] = 1
    path = _write(tmp_path / "tasks.jsonl", records)
    with pytest.raises(TaskFileError) as error:
        load_tasks(path)  # a file of two environments, each task checked against its own
    lines = str(error.value).splitlines()
    assert lines[0] == f"{path}: 2 problems in the task file:"
    assert lines[1].strip() == f"{path}:1: task {records[0]['task_id']!r}: checks is missing 'expected'"
    assert lines[2].strip() == f"{path}:4: task {records[3]['task_id']!r}: checks.spec.default must be a string, got int"


def test_a_long_list_of_problems_is_cut_short(tmp_path, good):
    template = good["script"][0]
    records = [{**copy.deepcopy(template), "task_id": f"script/x/{i}", "checks": {}} for i in range(MAX_REPORTED + 5)]
    path = _write(tmp_path / "tasks.jsonl", records)
    with pytest.raises(TaskFileError) as error:
        load_any(path, "script")
    message = str(error.value)
    assert message.startswith(f"{path}: {2 * len(records)} problems") and message.endswith(f"... and {2 * len(records) - MAX_REPORTED} more")


class _Inner(TypedDict):
    n: int


class _Shape(TypedDict):
    name: str
    count: int
    ratio: float
    flag: bool
    kind: Literal["a", "b"]
    cell: Union[int, str, None]
    inner: _Inner
    tags: list[str]
    files: dict[str, str]


_OK = {"name": "x", "count": 1, "ratio": 1, "flag": False, "kind": "a", "cell": None, "inner": {"n": 2},
       "tags": ["t"], "files": {"a": "b"}, "extra": "not declared, not checked"}


@pytest.mark.parametrize("change, problems", [
    ({}, []),  # extra keys are the environment's own business; an int is a number
    ({"count": True}, ["checks.count must be an integer, got bool"]),  # a bool is never a number
    ({"ratio": "1"}, ["checks.ratio must be a number, got str"]),
    ({"flag": 0}, ["checks.flag must be a boolean, got int"]),
    ({"kind": "c"}, ['checks.kind must be one of [\'a\', \'b\'], got "c"']),
    ({"cell": 1.5}, ["checks.cell must be an integer, a string or null, got float"]),
    ({"inner": {}}, ["checks.inner is missing 'n'"]),
    ({"tags": ["t", 3]}, ["checks.tags[1] must be a string, got int"]),
    ({"files": {"é.txt": 1}}, ['checks.files["é.txt"] must be a string, got int']),
    ({"name": None, "count": "2"}, ["checks.name must be a string, got null", "checks.count must be an integer, got str"]),
])
def test_shape_problems(change, problems):
    assert shape_problems({**_OK, **change}, _Shape, "checks") == problems


def test_a_missing_key_is_named():
    value = dict(_OK)
    del value["files"]
    assert shape_problems(value, _Shape, "checks") == ["checks is missing 'files'"]


# -- infrastructure errors in the summary and the exit status -------------------------------------

def _row(task_id: str, env: str, status: str, passed: bool = False) -> dict:
    return {"task_id": task_id, "env": env, "status": status, "passed": passed,
            "error": "" if passed else f"not judged: {task_id} broke" if status == "infra_error" else "wrong"}


def _printed(summary: dict, capsys) -> str:
    print_summary({**summary, "isolation": {}, "seconds": 0.1, "samples_per_s": 10.0}, Path("out.jsonl"))
    return capsys.readouterr().out


def test_infra_errors_are_counted_apart_and_never_scored(capsys):
    rows = [_row("s/1", "script", "infra_error"), _row("s/2", "script", "passed", True),
            _row("c/1", "code", "failed"), _row("c/1", "code", "infra_error")]
    summary = summarize(rows)
    assert summary["pass@1"] == 0.5 and summary["scored_samples"] == 2 and summary["tasks"] == 3
    assert summary["infra_errors"] == {"code": 1, "script": 1}
    assert summary["first_infra_error"] == {"task_id": "s/1", "error": "not judged: s/1 broke"}
    assert summary["per_env"] == {"code": 0.0, "script": 1.0}
    out = _printed(summary, capsys)
    assert "4 samples of 3 tasks: pass@1 0.500 (over the 2 scored samples of 2 tasks)" in out
    assert "infrastructure errors (not scored): 2 (code 1, script 1)" in out


def test_nothing_scored_is_not_a_pass(capsys):
    summary = summarize([_row("s/1", "script", "infra_error")])
    assert not [k for k in summary if k.startswith("pass@")] and summary["per_env"] == {"script": None}
    assert "1 samples of 1 tasks: pass@k n/a: every sample was an infrastructure error" in _printed(summary, capsys)
    summary = summarize([_row("s/1", "script", "infra_error"), _row("r/1", "rules", "passed", True)])
    assert "pass rate per environment: rules 1.000, script n/a" in _printed(summary, capsys)


# A user's environments: the script environment with its declarations switched off (so a task the
# sandbox cannot build reaches the sandbox), and one that inherits them (so it is checked at load).
USER_MODULE = textwrap.dedent('''
    from closedloop.envs.script import ScriptEnv


    class UncheckedScript(ScriptEnv):
        name = "rawscript"
        task_checks = None
        check_task = None


    class InheritedScript(ScriptEnv):
        name = "myscript"
''')


@pytest.fixture
def user_env(tmp_path, monkeypatch):
    (tmp_path / "user_script_envs.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    params = tmp_path / "params.yaml"
    params.write_text(json.dumps({"envs": {"custom": {
        "rawscript": {"entry": "user_script_envs:UncheckedScript"},
        "myscript": {"entry": "user_script_envs:InheritedScript"}}}}))
    return params


def _verify_as(tmp_path: Path, params: Path, records: list[dict], env: str) -> tuple[int, Path, Path]:
    records = [{**r, "env": env} for r in records]
    tasks = _write(tmp_path / "tasks.jsonl", records)
    samples = _write(tmp_path / "samples.jsonl", [{"task_id": r["task_id"], "completion": r["reference"]}
                                                   for r in records])
    out = tmp_path / "results.jsonl"
    argv = ["verify", "--tasks", str(tasks), "--samples", str(samples), "--out", str(out), "--params", str(params),
            "--workers", "1"]
    return main(argv), tasks, out


def test_a_job_the_sandbox_cannot_build_is_an_infra_error_and_fails_the_run(tmp_path, capsys, user_env, good):
    """The user's report, through a real sandbox: a non-string start file used to read as pass@1 1.000, exit 0."""
    first, bad = copy.deepcopy(good["script"])
    _set_start(7)(bad)
    code, _, out = _verify_as(tmp_path, user_env, [bad, first], "rawscript")
    captured = capsys.readouterr()
    assert code == 3, captured.err
    rows = read_jsonl(out)  # the results stand: every sample, in order, the broken one marked
    assert [r["status"] for r in rows] == ["infra_error", "passed"]
    assert "pass@1 1.000 (over the 1 scored samples of 1 tasks)" in captured.out
    assert "infrastructure errors (not scored): 1 (rawscript 1)" in captured.out
    assert (f"closedloop verify: 1 of 2 samples were sandbox infrastructure errors, left out of the scores; "
            f"the first is task {bad['task_id']!r}: not judged (sandbox infrastructure error") in captured.err

    code, _, out = _verify_as(tmp_path, user_env, [bad], "rawscript")
    captured = capsys.readouterr()
    assert code == 3 and "pass@k n/a: every sample was an infrastructure error" in captured.out


def test_a_user_environment_is_checked_by_what_it_declares(tmp_path, capsys, user_env, good):
    first, bad = copy.deepcopy(good["script"])
    del bad["checks"]["expected"]
    code, tasks, out = _verify_as(tmp_path, user_env, [first, bad], "myscript")
    assert code == 2 and not out.exists()
    assert f"{tasks}:2: task {bad['task_id']!r}: checks is missing 'expected'" in capsys.readouterr().err
