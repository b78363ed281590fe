"""A user's environment, defined outside the package, plugged in through params.yaml and taken through
a whole iteration; and the same class found through a `closedloop.environments` entry point."""

from __future__ import annotations

import textwrap

import pytest

from closedloop.io import read_json, read_jsonl, replace_dir
from closedloop.stages.common import run_stage
from closedloop.workspace import Workspace

# What a user writes in their own repository: no closedloop internals beyond Task and Verdict.
USER_MODULE = textwrap.dedent('''
    import hashlib
    import random

    from closedloop.envs.base import Task, Verdict

    WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "frost", "grain", "harbor", "island",
             "jungle", "kettle", "lantern", "meadow", "needle", "orbit", "pepper", "quartz", "saddle", "timber"]


    def match(expected, completion):
        return 1.0 if completion.strip() == expected else 0.0


    class EchoEnv:
        """Repeat a word, upper-cased if the task says so."""

        name = "echo"
        uses_sandbox = False
        components = ("match",)
        default_weights = {"match": 1.0}

        def __init__(self, params):
            self.params = params
            self.upper = bool(params.options.get("upper", False))

        def generate(self, n, seed, split, slice="core"):
            rng = random.Random(f"{seed}/{split}/{slice}")
            tasks = []
            for index in range(n):
                word = rng.choice(WORDS) + str(index)
                answer = word.upper() if self.upper else word
                key = hashlib.sha256(f"{split}/{slice}/{word}".encode()).hexdigest()[:10]
                tasks.append(Task(task_id=f"echo/{split}/{slice}/{key}", env="echo", split=split, slice=slice,
                                  kind="echo", prompt=f"# Repeat: {word}\\n", entry_point="",
                                  checks={"answer": answer}, reference=answer + "\\n"))
            return tasks

        def reference(self, task):
            return task.reference

        def verify_batch(self, tasks, completions, pool):
            assert pool is None  # uses_sandbox = False: the loop gives no pool
            verdicts = []
            for task, completion in zip(tasks, completions):
                score = match(task.checks["answer"], completion)
                verdicts.append(Verdict(components={"match": score}, steps={"matches": bool(score)},
                                        passed=bool(score), feedback="" if score else f"expected {task.checks['answer']}",
                                        status="passed" if score else "failed",
                                        failed_step=None if score else "matches"))
            return verdicts

        def component_sources(self):
            return {"match": (match, {"upper": self.upper})}
''')


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    """The user's module in a folder of its own (not in closedloop), importable as `user_envs`."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "user_envs.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    return folder


def custom_params(entry: str) -> dict:
    import copy

    from tests.conftest import TINY

    data = copy.deepcopy(TINY)
    for name in ("data", "script", "extract", "rules"):  # code and the user's env keep the test short
        data["envs"][name]["share"] = 0.0
    data["envs"]["custom"] = {"echo": {"entry": entry, "share": 1.0, "options": {"upper": True},
                                       "benchmark": {"core": 3, "edge": 1, "failure_modes": 1}}}
    return data


def test_user_env_runs_a_whole_iteration(user_module, tmp_path):
    import yaml

    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(custom_params("user_envs:EchoEnv")))
    ws = Workspace.at(root)
    for name in ("benchmark", "warmstart"):
        run_stage(name, root)
    replace_dir(ws.warmstart_model, ws.champion)
    for name in ("generate", "sample", "reward", "grade", "validate", "train", "evaluate", "gate", "promote"):
        run_stage(name, root)

    benchmark = read_jsonl(ws.benchmark_tasks)
    assert {t["env"] for t in benchmark} == {"code", "echo"}
    assert sum(t["env"] == "echo" for t in benchmark) == 5
    tasks = read_jsonl(ws.tasks)
    assert {t["env"] for t in tasks} == {"code", "echo"}
    assert all(t["checks"]["answer"].isupper() for t in tasks if t["env"] == "echo")  # options reached the env
    references = read_jsonl(ws.references)
    assert any(r["env"] == "echo" for r in references)

    rewards = [r for r in read_jsonl(ws.rewards) if r["env"] == "echo"]
    assert rewards and all(set(r["components"]) == {"match"} for r in rewards)
    assert all("component:echo/match" in r["feedback_sources"] and "verifier:echo" in r["feedback_sources"]
               for r in rewards)
    evaluation = read_json(ws.evaluation)
    assert {"echo/core", "echo/edge", "echo/failure_modes"} <= set(evaluation["candidate"]["summary"]["slices"])
    assert "echo" in evaluation["candidate"]["summary"]["envs"]
    gate = read_json(ws.gate)
    assert any(reason.startswith("slice echo/core") for reason in gate["reasons"])
    reward_metrics = read_json(ws.metrics("reward"))
    assert "match" in reward_metrics["per_env"]["echo"]["components"]


def test_user_env_from_an_entry_point(user_module, tmp_path):
    """`entry: echo-env` names an entry point of an installed distribution (a real dist-info here)."""
    from closedloop.config import parse_params
    from closedloop.envs import get_env

    dist = user_module / "user_envs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: user-envs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[closedloop.environments]\necho-env = user_envs:EchoEnv\n")
    params = parse_params(custom_params("echo-env"))
    env = get_env("echo", params)
    tasks = env.generate(3, 1, "train")
    assert [v.passed for v in env.verify_batch(tasks, [t.reference for t in tasks], None)] == [True] * 3


@pytest.mark.parametrize("entry, message", [
    ("no_such_module:Env", "envs.custom.echo.entry: cannot import module 'no_such_module'"),
    ("user_envs:Missing", "module 'user_envs' has no 'Missing'"),
    ("not-an-entry-point", "neither 'module:Class' nor the name of an entry point"),
    ("user_envs:WORDS", "lacks ["),
])
def test_a_bad_entry_fails_naming_the_key(user_module, tmp_path, entry, message):
    import yaml

    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(custom_params(entry)))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        run_stage("benchmark", root)
    assert not Workspace.at(root).benchmark_tasks.exists()


def test_a_malformed_task_file_names_line_and_field_and_writes_no_batch(tmp_path):
    import json

    import yaml

    from tests.conftest import TINY

    good = {"task_id": "rules/x/1", "env": "rules", "split": "train", "slice": "core", "kind": "k",
            "prompt": "p\n", "entry_point": "", "checks": {}, "reference": "r\n"}
    lines = [json.dumps(good), json.dumps({**good, "task_id": "rules/x/2", "checks": "oops"})]
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("\n".join(lines) + "\n")
    root = tmp_path / "ws"
    root.mkdir()
    data = {**TINY, "envs": {**TINY["envs"], "rules": {**TINY["envs"]["rules"], "train_file": str(task_file)}}}
    (root / "params.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=rf"{task_file}:2: field 'checks' must be an object"):
        run_stage("generate", root)
    assert not Workspace.at(root).tasks.exists()
