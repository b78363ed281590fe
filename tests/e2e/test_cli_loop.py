"""The user's path end to end: `closedloop run` on a fresh workspace, then `dvc repro` reproduces it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
# The columns README.md's `dvc exp show` keeps: the iteration, its scores, the gate, the batch.
README_EXP_SHOW_KEEP = ("Experiment|loop\\.iteration|(candidate|champion)_pass@1(/[a-z]+)?$|promote$"
                        "|.*reward_mean$|buckets\\.")
REPRODUCIBLE_OUTS = ("data/batch/tasks.jsonl", "data/batch/samples.jsonl", "data/batch/rewards.jsonl",
                     "data/batch/graded.jsonl", "data/batch/fixes.jsonl", "data/batch/train_set.jsonl")


def cli(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PREFECT_API_URL", None)  # the user's path: Prefect's ephemeral API
    result = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=900)
    if check and result.returncode:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def lock_outs(root: Path) -> dict[str, str]:
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])}


@pytest.fixture(scope="module")
def ran(workspace_factory):
    root = workspace_factory()
    result = cli("closedloop", "run", "--iterations", "2", "--no-progress", cwd=root)
    return root, result


@pytest.fixture(scope="module")
def workspace_factory(tmp_path_factory):
    from tests.conftest import TINY

    def make() -> Path:
        root = tmp_path_factory.mktemp("e2e") / "ws"
        root.mkdir()
        (root / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
        cli("closedloop", "init", str(root), cwd=root)
        return root

    return make


def test_run_prints_each_iteration_next_to_the_champion(ran):
    _, result = ran
    out = result.stdout
    assert "warm start" in out and "benchmark pass@1" in out
    assert "iteration 1" in out and "iteration 2" in out and "vs champion" in out
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def test_dvc_status_clean_and_repro_has_nothing_to_do(ran):
    root, _ = ran
    status = cli("dvc", "status", cwd=root).stdout
    assert "up to date" in status, status
    before = lock_outs(root)
    repro = cli("dvc", "repro", cwd=root).stdout
    assert "Running stage" not in repro, repro
    assert lock_outs(root) == before


def test_dvc_metrics_plots_and_experiments_show_the_loop(ran):
    """What a user runs after two iterations: every metric a number, the plots one point per iteration
    per environment, `dvc plots diff` of the two experiments, and an experiments table that reads."""
    import csv
    import io
    import json

    from closedloop.plots import DEFINITIONS

    root, _ = ran
    shown = cli("dvc", "metrics", "show", "--json", cwd=root)
    assert "failed to load" not in shown.stderr, shown.stderr  # DVC's words for a file it could not read
    files = json.loads(shown.stdout)[""]["data"]
    assert "metrics/evaluate.json" in files and "metrics/timing/train.json" in files
    assert not [path for path, entry in files.items() if "error" in entry]

    def numbers_only(data):
        return all(numbers_only(v) for v in data.values()) if isinstance(data, dict) else \
            isinstance(data, (int, float))

    for path in sorted(root.glob("metrics/*.json")) + sorted(root.glob("metrics/timing/*.json")):
        assert numbers_only(json.loads(path.read_text())), f"{path.relative_to(root)} holds more than numbers"
        assert "seconds" not in json.loads(path.read_text()) or "timing" in path.parts
    assert "failed to load" not in cli("dvc", "metrics", "show", cwd=root).stderr

    plots = json.loads(cli("dvc", "plots", "show", "--json", cwd=root).stdout)["data"]
    assert list(plots) == [title for title, _ in DEFINITIONS]
    (history,) = plots[DEFINITIONS[0][0]]
    points = [(p["iteration"], p["env"]) for p in history["content"]["data"]["values"]]
    envs = json.loads((root / "data/reports/evaluation.json").read_text())["candidate"]["summary"]["envs"]
    assert len(envs) == 5  # every environment of the tiny params
    # one point per iteration per environment, and the whole benchmark as "overall"
    assert sorted(points) == sorted((i, env) for i in (1, 2) for env in (*envs, "overall"))
    for title, entries in plots.items():
        assert entries[0]["content"]["data"]["values"], f"plot {title!r} has no data"

    names = sorted(ref.rsplit("/", 1)[-1] for ref in subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cwd=root, capture_output=True,
        text=True).stdout.split() if "/iter-" in ref)
    diffed = json.loads(cli("dvc", "plots", "diff", *names, "--json", cwd=root).stdout)["data"]
    (history,) = diffed[DEFINITIONS[0][0]]
    assert history["revisions"] == names  # each experiment its own series

    table = json.loads(cli("dvc", "exp", "show", "--only-changed", "--json", cwd=root).stdout)
    assert table and not [rev for rev in table if rev.get("error")]
    # the README's command: the headline of each iteration on one screen
    readable = cli("dvc", "exp", "show", "--no-pager", "--csv", "--only-changed", "--drop", ".*", "--keep",
                   README_EXP_SHOW_KEEP, cwd=root).stdout
    header = next(csv.reader(io.StringIO(readable)))
    assert "loop.iteration" in header and "candidate_pass@1" in header and len(header) < 40, header


def test_status_names_the_champion_and_iterations(ran):
    root, _ = ran
    out = cli("closedloop", "status", cwd=root).stdout
    assert "champion    closedloop-policy v" in out
    from closedloop.models.loading import model_fingerprint

    assert f"fingerprint {model_fingerprint(root / 'data/champion')}" in out  # what a server may serve it as
    assert "iteration-001" in out and "iteration-002" in out
    assert "iter-001-" in out


def test_restore_iteration_one_and_reproduce_same_hashes(ran):
    root, _ = ran
    experiments = subprocess.run(["git", "for-each-ref", "--format=%(refname:short)", "refs/exps"], cwd=root,
                                 capture_output=True, text=True).stdout.split()
    (first,) = [ref.rsplit("/", 1)[-1] for ref in experiments if "/iter-001-" in ref]
    cli("dvc", "exp", "apply", first, cwd=root)
    assert yaml.safe_load((root / "params.yaml").read_text())["loop"]["iteration"] == 1
    saved = lock_outs(root)
    assert cli("dvc", "status", cwd=root).stdout.strip().endswith("up to date.")
    cli("dvc", "repro", "--force", cwd=root)
    reproduced = lock_outs(root)
    for out in REPRODUCIBLE_OUTS:
        assert reproduced[out] == saved[out], f"{out} did not reproduce"


def test_bad_params_fail_at_once_and_write_nothing(workspace_factory):
    root = workspace_factory()
    params = root / "params.yaml"
    for text, key in (("sample:\n  kk: 3\n", "sample.kk: unknown key"),
                      ("train:\n  steps: many\n", "train.steps")):
        params.write_text(text)
        before = sorted(p.relative_to(root) for p in root.rglob("*") if ".git" not in p.parts)
        result = cli("closedloop", "run", "--iterations", "1", cwd=root, check=False)
        assert result.returncode != 0
        assert key in result.stderr and "params.yaml" in result.stderr
        after = sorted(p.relative_to(root) for p in root.rglob("*") if ".git" not in p.parts)
        assert after == before
