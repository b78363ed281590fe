"""Re-scoring a stored batch: one real iteration (every stage, real sandbox for the code samples) of
a user's environment whose check can become stricter, saved as a DVC experiment; then `closedloop
rescore` with today's params.yaml, unchanged and stricter, and `closedloop status` naming the batch."""

from __future__ import annotations

import copy
import hashlib
import json
import statistics
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from closedloop import workspace as paths
from closedloop.cli import main
from closedloop.io import read_json
from closedloop.lineage.dvc import DvcWorkspace

# A user's environment: "say something". Lenient, any non-blank completion passes; with
# options.max_chars set, only one of at most that many characters does (the stricter check).
USER_MODULE = textwrap.dedent('''
    import hashlib
    import random

    from closedloop.envs.base import Task, Verdict

    WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "frost", "grain", "harbor", "island"]


    def said(completion, max_chars):
        text = completion.strip()
        return 1.0 if text and (max_chars is None or len(text) <= max_chars) else 0.0


    class TerseEnv:
        name = "terse"
        uses_sandbox = False
        components = ("said",)
        default_weights = {"said": 1.0}

        def __init__(self, params):
            self.max_chars = params.options.get("max_chars")

        def generate(self, n, seed, split, slice="core"):
            rng = random.Random(f"{seed}/{split}/{slice}")
            tasks = []
            for index in range(n):
                word = rng.choice(WORDS) + str(index)
                key = hashlib.sha256(f"{split}/{slice}/{word}".encode()).hexdigest()[:10]
                tasks.append(Task(task_id=f"terse/{split}/{slice}/{key}", env="terse", split=split, slice=slice,
                                  kind="terse", prompt=f"# Say: {word}\\n", entry_point="", checks={"word": word},
                                  reference=word + "\\n"))
            return tasks

        def reference(self, task):
            return task.reference

        def verify_batch(self, tasks, completions, pool):
            verdicts = []
            for completion in completions:
                score = said(completion, self.max_chars)
                verdicts.append(Verdict(components={"said": score}, steps={"said": bool(score)}, passed=bool(score),
                                        feedback="" if score else "blank or too long",
                                        status="passed" if score else "failed", failed_step=None if score else "said"))
            return verdicts

        def component_sources(self):
            return {"said": (said, {"max_chars": self.max_chars})}
''')
MODULE = "rescore_user_envs"  # not test_custom_env's name: sys.modules keeps the first one imported


def terse_params(max_chars: int | None = None) -> dict:
    from tests.conftest import TINY

    data = copy.deepcopy(TINY)
    for name in ("data", "script", "extract", "rules"):  # code (sandboxed) and the user's env
        data["envs"][name]["share"] = 0.0
    options = {} if max_chars is None else {"max_chars": max_chars}
    data["envs"]["custom"] = {"terse": {"entry": f"{MODULE}:TerseEnv", "share": 1.0, "options": options,
                                        "benchmark": {"core": 2, "edge": 1, "failure_modes": 1}}}
    # grpo with on-policy rounds: the train stage samples and scores half the tasks itself, and those
    # reward rows are re-scored beside rewards.jsonl's
    data.setdefault("train", {}).update({"mode": "grpo", "grpo": {"rounds": 2}})
    return data


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One iteration, every stage run and recorded as the loop does, saved as a DVC experiment named
    as the loop names it. Its batch carries a human label (on the first terse sample)."""
    from closedloop.config import load_params
    from closedloop.io import read_jsonl, write_jsonl
    from closedloop.versioning.loop import close_loop, record_labels
    from closedloop.pipeline import STAGE_NAMES
    from closedloop.rewards.human import completion_sha256
    from closedloop.scaffold import init_workspace
    from closedloop.stages.recorded import run_recorded
    from closedloop.workspace import Workspace

    base = tmp_path_factory.mktemp("rescore")
    code = base / "user_code"
    code.mkdir()
    (code / f"{MODULE}.py").write_text(USER_MODULE)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(code))
        root = base / "ws"
        root.mkdir()
        (root / "params.yaml").write_text(yaml.safe_dump(terse_params(), sort_keys=False))
        init_workspace(root)
        ws, params = Workspace.at(root), load_params(root)
        for stage in STAGE_NAMES:
            if stage == "reward":  # a review answer queued before it: the batch's labels
                sample = next(s for s in read_jsonl(ws.samples) if s["env"] == "terse")
                write_jsonl(ws.human_labels, [{
                    "answer_id": "a1", "sample_id": sample["sample_id"], "task_id": sample["task_id"],
                    "env": "terse", "completion_sha256": completion_sha256(sample["completion"]),
                    "reviewer": "ana", "score": 0.0, "label": "wrong", "comment": ""}])
                record_labels(ws)
            run_recorded(stage, root, params)
            if stage == "warmstart":
                close_loop(ws)
        name = f"iter-001-{read_json(ws.gate)['candidate']['model_version'][:8]}"
        DvcWorkspace(root).exp_save(name)
        yield root, name


@pytest.fixture
def ws(saved, tmp_path):
    """A private copy of the saved workspace (`cp -a` keeps the links into its cache)."""
    root, name = saved
    copy_root = tmp_path / "ws"
    subprocess.run(["cp", "-a", str(root), str(copy_root)], check=True)
    return copy_root, name


def rescore(root: Path, capsys, *args: str) -> tuple[int, str, str]:
    code = main(["rescore", "--workspace", str(root), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def stored(root: Path, name: str, relative: str) -> list[dict]:
    return jsonl(DvcWorkspace(root).read_at(relative, name))


def snapshot(root: Path) -> dict[str, str]:
    """Every file of the workspace (git and DVC's cache included) but .dvc/tmp, where DVC and
    closedloop take their locks while reading."""
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[:2] != (".dvc", "tmp")}


def test_unchanged_verifiers_change_nothing_and_the_hashes_match(ws, capsys, tmp_path):
    root, name = ws
    # Today's labels file is not the batch's: rescore reads the labels the experiment saved.
    (root / paths.HUMAN_LABELS).unlink()
    before = snapshot(root)
    out = tmp_path / "report.json"
    code, text, _ = rescore(root, capsys, "--experiment", name, "--out", str(out))
    assert code == 0
    report = read_json(out)
    assert report["experiment"] == name and report["samples"] == 20
    assert report["changed_reward"] == report["changed_verdict"] == 0
    assert set(report["envs"]) == {"code", "terse"}
    for figures in report["envs"].values():
        assert figures["changed_reward"] == figures["changed_verdict"] == 0 and figures["examples"] == []
        assert all(c["changed"] == 0 for c in figures["components"].values())
    assert report["sources"] == {"changed": {}, "added": {}, "removed": {}}
    hashes = report["hashes"]
    assert hashes["identical"] and hashes["sha256"]["stored"] == hashes["sha256"]["rescored"]
    # The stored file's md5 is the hash DVC recorded for it in that experiment.
    assert hashes["md5"]["stored"] == hashes["md5"]["rescored"] == \
        DvcWorkspace(root).recorded_out(paths.REWARDS, name)["md5"]
    assert f"stored {hashes['sha256']['stored']}  rescored {hashes['sha256']['stored']}  (identical)" in text
    assert "0 changed reward, 0 changed verdict" in text
    assert snapshot(root) == before  # nothing in the workspace, its DVC records or cache written
    labelled = [row for row in stored(root, name, paths.REWARDS) if "human" in row["components"]]
    assert len(labelled) == 1  # the label the batch saw is in the rows rescore matched byte for byte
    rounds = report["train_rounds"]  # the train stage's own samples (grpo rounds), scored again alike
    assert rounds["samples"] == len(stored(root, name, paths.TRAIN_ROUNDS)) > 0
    assert rounds["changed_reward"] == rounds["changed_verdict"] == 0 and rounds["hashes"]["identical"]
    assert f"train rounds (grpo on-policy): {rounds['samples']} samples, 0 changed reward" in text

    # --all: every stored iteration, here the one.
    code, _, _ = rescore(root, capsys, "--all", "--out", str(out))
    assert code == 0 and [r["experiment"] for r in read_json(out)["reports"]] == [name]


def test_a_stricter_check_names_the_samples_it_changed_and_status_names_the_batch(ws, capsys, tmp_path):
    from closedloop.config import load_params
    from closedloop.envs import get_env
    from closedloop.rewards.sources import verifier_version
    from closedloop.status import stale_lines

    root, name = ws
    assert stale_lines(root, load_params(root)) == []  # scored by today's verifiers
    samples = {s["sample_id"]: s for s in stored(root, name, paths.SAMPLES)}
    old_rows = stored(root, name, paths.REWARDS)
    terse = [row for row in old_rows if row["env"] == "terse"]
    limit = int(statistics.median(len(samples[row["sample_id"]]["completion"].strip()) for row in terse))
    # Computed apart from closedloop: the stored passes the stricter rule fails.
    expected = {row["sample_id"] for row in terse
                if row["passed"] and len(samples[row["sample_id"]]["completion"].strip()) > limit}
    assert 0 < len(expected) < len(terse)  # the rule splits the batch: a change to find, and rows that stay
    (root / "params.yaml").write_text(yaml.safe_dump(terse_params(max_chars=limit), sort_keys=False))

    out = tmp_path / "report.json"
    code, text, _ = rescore(root, capsys, "--experiment", name, "--out", str(out))
    assert code == 0
    report = read_json(out)
    figures = report["envs"]["terse"]
    assert figures["changed_verdict"] == figures["changed_reward"] == len(expected) == report["changed_verdict"]
    assert figures["components"]["said"]["changed"] == len(expected)
    examples = figures["examples"]
    assert len(examples) == min(5, len(expected)) and {e["sample_id"] for e in examples} <= expected
    assert all(e["passed"] == [True, False] and e["components"]["said"] == [1.0, 0.0] for e in examples)
    assert report["envs"]["code"]["changed_reward"] == report["envs"]["code"]["changed_verdict"] == 0
    old_version = {row["feedback_sources"]["verifier:terse"] for row in terse}
    new_version = verifier_version("terse", get_env("terse", load_params(root)), load_params(root))
    assert report["sources"]["changed"]["verifier:terse"] == [sorted(old_version), [new_version]]
    assert set(report["sources"]["changed"]) == {"verifier:terse", "component:terse/said"}
    assert not report["hashes"]["identical"]
    round_rows = [r for r in stored(root, name, paths.TRAIN_ROUNDS) if r["env"] == "terse"]
    expected_rounds = sum(r["scored"]["passed"] and len(r["completion"].strip()) > limit for r in round_rows)
    assert report["train_rounds"]["envs"]["terse"]["changed_verdict"] == expected_rounds
    for e in examples:  # the labelled sample's reward is 0.5 (verifier 1, human 0) before, not 1
        assert f"{e['sample_id']}: reward {e['reward'][0]:.3f} -> 0.000, passed (passed) -> not passed (failed)" in text
    assert "verifier:terse" in text

    # Only the code samples: today's code verifier is the stored one, so their lines hash the same.
    code, _, _ = rescore(root, capsys, "--experiment", name, "--env", "code", "--out", str(out))
    only_code = read_json(out)
    assert code == 0 and set(only_code["envs"]) == {"code"} and only_code["changed_reward"] == 0
    assert only_code["hashes"]["identical"] and only_code["sources"]["changed"] == {}

    assert main(["status", "--workspace", str(root)]) == 0
    status = capsys.readouterr().out
    assert f"{name} (verifier:terse changed) — closedloop rescore --experiment {name}" in status


def test_a_bad_experiment_name_exits_2_naming_it_and_the_known_ones(ws, capsys, tmp_path):
    root, name = ws
    out = tmp_path / "report.json"
    code, _, err = rescore(root, capsys, "--experiment", "iter-009-deadbeef", "--out", str(out))
    assert code == 2
    assert "iter-009-deadbeef" in err and name in err
    assert not out.exists()
    code, _, err = rescore(root, capsys, "--experiment", name, "--env", "nope", "--out", str(out))
    assert code == 2 and "--env nope" in err and "code, terse" in err and not out.exists()


@pytest.mark.parametrize("recorded, today, changed", [
    # the same versions: nothing to re-score
    ({"verifier:code": "a", "combiner": "c"}, {"verifier:code": "a", "combiner": "c"}, []),
    # a verifier changed: its components go unsaid (the verifier's version covers them)
    ({"verifier:code": "a", "component:code/runs": "r"}, {"verifier:code": "b", "component:code/runs": "s"},
     ["verifier:code"]),
    # a component alone changed (its function, not the class), and the combiner's weights
    ({"verifier:code": "a", "component:code/runs": "r", "combiner": "c"},
     {"verifier:code": "a", "component:code/runs": "s", "combiner": "d"}, ["combiner", "component:code/runs"]),
    # the labels' hash and the batch validator decide no reward; an env added since is no change
    ({"human": "h1", "validator:batch": "v1"}, {"human": "h2", "validator:batch": "v2", "verifier:data": "x"}, []),
])
def test_scoring_changes(recorded, today, changed):
    from closedloop.rescore import scoring_changes

    assert scoring_changes(recorded, today) == changed
