"""The user's path end to end: `closedloop run` on a fresh workspace, then `dvc repro` reproduces it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
# The columns docs/lineage.md's `dvc exp show` keeps: the iteration, its scores, the gate, the batch.
README_EXP_SHOW_KEEP = ("Experiment|loop\\.iteration|(candidate|champion)_pass@1(/[a-z]+)?$|promote$"
                        "|.*reward_mean$|buckets\\.")
REPRODUCIBLE_OUTS = ("data/batch/tasks.jsonl", "data/batch/samples.jsonl", "data/batch/rewards.jsonl",
                     "data/batch/graded.jsonl", "data/batch/fixes.jsonl", "data/batch/train_set.jsonl")
REPRODUCING_STAGES = ("generate", "sample", "reward", "grade")  # the stages that write REPRODUCIBLE_OUTS


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

    from closedloop.reports.plots import DEFINITIONS

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
    # docs/lineage.md's command: the headline of each iteration on one screen
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


def _experiment(root: Path, iteration: int) -> str:
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cwd=root, capture_output=True,
                          text=True).stdout.split()
    (name,) = [ref.rsplit("/", 1)[-1] for ref in refs if f"/iter-{iteration:03d}-" in ref]
    return name


def _run_of(root: Path, iteration: int) -> str:
    from closedloop.config import load_params
    from closedloop.lineage import tracking
    from closedloop.lineage.mlflow_layout import run_key
    from closedloop.workspace import Workspace

    params = load_params(root)
    tracking.configure(root, params.tracking.uri, params.tracking.experiment)
    (run_id,) = tracking.find_runs(params.tracking.experiment, run_key(Workspace.at(root).root, iteration, "iteration"),
                                   status="FINISHED")
    return run_id


def test_report_page_shows_the_gate_both_iterations_and_real_plots(ran, tmp_path):
    """Before test_restore_iteration_one_…, which moves the workspace back to iteration 1."""
    import base64
    import json
    import re

    from closedloop.reports.gate_report import decision_sentence

    root, _ = ran
    out = tmp_path / "report.html"
    result = cli("closedloop", "report", "--out", str(out), cwd=root)
    assert "iteration 2" in result.stdout and "read from the workspace" in result.stdout
    page = out.read_text()
    images = [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]
    assert len(images) >= 4 and all(data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000 for data in images)
    gate = json.loads((root / "data/reports/gate.json").read_text())
    from closedloop.lineage.dvc import DvcWorkspace

    rev = DvcWorkspace(root).experiment_rev(_experiment(root, 1))
    first = json.loads(subprocess.run(["git", "show", f"{rev}:./metrics/evaluate.json"], cwd=root,
                                      capture_output=True, text=True, check=True).stdout)["candidate_pass@1"]
    # the gate's decision, with the champion's registry version the loop compared it with
    assert re.search(r"<strong>(Held|Promoted):</strong>", page)
    parent = re.search(r"compared with champion v(\d+)", page).group(1)
    from html import escape

    assert escape(decision_sentence(gate, parent).split(":", 1)[1]) in page
    # both iterations' pass@1: iteration 1 from its experiment, 2 from the workspace's evaluation
    assert re.search(rf"<tr><td>1</td><td class=\"num\">{first:.3f}</td>", page), page[-4000:]
    assert re.search(rf"<tr><td>2 v\d+</td><td class=\"num\">{gate['candidate']['overall']['pass@1']:.3f}</td>", page)
    assert _run_of(root, 2) in page  # the MLflow run of the model version
    monitors = root / "data/reports/monitors.json"
    if monitors.exists():  # the monitors stage ran: each monitor is a row with its verdict
        for row in json.loads(monitors.read_text())["monitors"]:
            assert f"<code>{escape(row['name'])}</code>" in page
    else:
        assert "The monitors did not run for this iteration" in page


def test_report_of_iteration_one_reads_its_batch_through_dvc(ran, tmp_path):
    from closedloop.lineage.dvc import DvcWorkspace

    root, _ = ran
    name = _experiment(root, 1)
    out = tmp_path / "one.html"
    assert f"DVC experiment {name}" in cli("closedloop", "report", "--iteration", "1", "--out", str(out), cwd=root).stdout
    page = out.read_text()
    rows = [line for line in DvcWorkspace(root).read_at("data/batch/rewards.jsonl", name).splitlines() if line]
    rev = DvcWorkspace(root).experiment_rev(name)
    lock = yaml.safe_load(subprocess.run(["git", "show", f"{rev}:./dvc.lock"], cwd=root, capture_output=True,
                                         text=True, check=True).stdout)
    saved = {out["path"]: out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])}
    assert saved["data/batch/rewards.jsonl"] != lock_outs(root)["data/batch/rewards.jsonl"]  # not the workspace's
    assert f"{len(rows)} reward rows" in page and saved["data/batch/rewards.jsonl"] in page
    assert "closedloop — iteration 1" in page and _run_of(root, 1) in page


def test_report_of_an_unknown_iteration_exits_2_and_writes_nothing(ran, tmp_path):
    root, _ = ran
    out = tmp_path / "none.html"
    result = cli("closedloop", "report", "--iteration", "9", "--out", str(out), cwd=root, check=False)
    assert result.returncode == 2 and "the iterations that exist: 1, 2" in result.stderr, result.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def test_each_iterations_mlflow_run_has_its_report_page(ran, tmp_path):
    import mlflow

    root, _ = ran
    for iteration in (1, 2):
        run_id = _run_of(root, iteration)
        name = f"report-iteration-{iteration}.html"
        assert name in [a.path for a in mlflow.MlflowClient().list_artifacts(run_id)]
        text = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name,
                                                        dst_path=str(tmp_path))).read_text()
        assert text.startswith("<!DOCTYPE html>") and f"closedloop — iteration {iteration}" in text
        assert "timing/report" in mlflow.MlflowClient().get_run(run_id).data.metrics


def test_restore_iteration_one_and_reproduce_same_hashes(ran):
    root, _ = ran
    experiments = subprocess.run(["git", "for-each-ref", "--format=%(refname:short)", "refs/exps"], cwd=root,
                                 capture_output=True, text=True).stdout.split()
    (first,) = [ref.rsplit("/", 1)[-1] for ref in experiments if "/iter-001-" in ref]
    cli("dvc", "exp", "apply", first, cwd=root)
    assert yaml.safe_load((root / "params.yaml").read_text())["loop"]["iteration"] == 1
    saved = lock_outs(root)
    assert cli("dvc", "status", cwd=root).stdout.strip().endswith("up to date.")
    # Forced, only the stages that write what is compared (the warm start, training and evaluation
    # are not compared here; the resume tests compare the candidate of two runs from scratch).
    cli("dvc", "repro", "--force", "--single-item", *REPRODUCING_STAGES, cwd=root)
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
