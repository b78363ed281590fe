"""One static HTML page per iteration: `closedloop report`, and the MLflow artifact each iteration logs.

The page is self-contained (CSS inline, figures as base64 PNG), so it can be mailed, attached to a
ticket or opened from the MLflow artifact store as it is. It shows the gate decision and its reasons,
the monitors' table, benchmark pass@1 per environment and per slice across iterations, the batch's
reward components and completion lengths (passed vs failed), and the lineage of the candidate
model (DVC experiment and hashes, feedback source versions, git commits, MLflow run and version).

Where an iteration's files come from: the workspace when params.yaml's ``loop.iteration`` is that
iteration (the batch there is its own), else the iteration's newest DVC experiment
(DvcWorkspace.read_at for DVC-tracked files; git for the metrics files git keeps with it).
pass@1 across iterations is read from each earlier experiment's metrics/evaluate.json (git, a few
ms each), so rendering stays cheap as the history grows.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from closedloop import workspace as paths
from closedloop.lineage import tracking
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.gitstate import git_try
from closedloop.lineage.mlflow_layout import run_key
from closedloop.lineage.preflight import check_store
from closedloop.reports.html import LINEAGE_FIRST, render
from closedloop.workspace import Workspace

MONITORS = "data/reports/monitors.json"  # the monitors stage's report (absent before it ran)
EVALUATE_METRICS = "metrics/evaluate.json"
POINTERS = (paths.CHAMPION, paths.HUMAN_LABELS, paths.KNOWN_HACKS, paths.REVIEW_OUTCOME)  # `dvc add`ed


class ReportError(ValueError):
    """An iteration the workspace has no record of, or records it cannot read."""


@dataclass
class PageData:
    """Everything the page shows, as plain records."""

    iteration: int
    experiment: str | None  # the iteration's newest DVC experiment (None: not saved as one)
    exp_rev: str
    git_rev: str  # the commit the iteration ran on (the experiment's parent)
    read_from: str  # where the batch was read: "the workspace" or "DVC experiment …"
    samples: list[dict[str, Any]]
    rewards: list[dict[str, Any]]
    gate: dict[str, Any] | None
    evaluation: dict[str, Any] | None
    monitors: dict[str, Any] | None
    history: list[dict[str, Any]]  # {iteration, name, candidate, champion}; name "overall", an env or env/slice
    hashes: dict[str, str]  # DVC-tracked path -> md5 as the iteration recorded it
    sources: dict[str, list[str]]  # feedback source -> the versions its rows name
    mlflow: dict[str, Any] = field(default_factory=dict)  # run_id, experiment_id, tracking_uri, model_version, ...


# -- which iterations exist, and where their files are -----------------------------------------------
def recorded_iterations(ws: Workspace, loop_iteration: int) -> dict[int, str | None]:
    """Iteration -> its newest DVC experiment (None where it was not saved as one): every saved
    experiment, and the workspace's own iteration when its batch has been gated."""

    found: dict[int, str | None] = {}
    try:
        found.update(DvcWorkspace(ws.root).iteration_experiments())
    except Exception:  # noqa: BLE001  (no git repository: only the workspace's own iteration)
        pass
    if loop_iteration >= 1 and ws.gate.exists():
        found.setdefault(loop_iteration, None)
    return dict(sorted(found.items()))


class _Files:
    """Reads one iteration's files: from the workspace, or as its DVC experiment saved them."""

    def __init__(self, ws: Workspace, experiment: str | None, in_workspace: bool):
        self.ws, self.experiment, self.in_workspace = ws, experiment, in_workspace
        self.dvc = DvcWorkspace(ws.root)
        self.rev = self.dvc.experiment_rev(experiment) if experiment else ""

    def text(self, relative: str) -> str | None:
        if self.in_workspace:
            path = self.ws.path(relative)
            return path.read_text(encoding="utf-8") if path.is_file() else None

        kept = git_try(self.ws.root, "show", f"{self.rev}:./{relative}", strip=False)  # git-tracked (metrics/)
        if kept is not None:
            return kept
        if self.dvc.locate(relative, self.experiment) is None:
            return None  # the experiment does not record it (an older one, or a stage that never ran)
        return self.dvc.read_at(relative, self.experiment)

    def json(self, relative: str) -> Any:
        text = self.text(relative)
        return None if text is None else json.loads(text)

    def jsonl(self, relative: str) -> list[dict[str, Any]]:
        text = self.text(relative)
        return [json.loads(line) for line in (text or "").splitlines() if line.strip()]

    def hashes(self) -> dict[str, str]:
        """The md5 of every DVC-tracked file and folder under data/ as this iteration recorded it."""
        import yaml

        def read(relative: str) -> str | None:
            if self.in_workspace:
                path = self.ws.path(relative)
                return path.read_text() if path.is_file() else None

            return git_try(self.ws.root, "show", f"{self.rev}:./{relative}", strip=False)

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # dvc.lock is ~85 kB: libyaml parses it in ~50 ms
        lock = yaml.load(read("dvc.lock") or "{}", Loader=loader) or {}
        found = {out["path"]: out.get("md5", "") for stage in (lock.get("stages") or {}).values()
                 for out in stage.get("outs", []) if out["path"].startswith("data/")}
        for pointer in POINTERS:
            outs = (yaml.load(read(pointer + ".dvc") or "{}", Loader=loader) or {}).get("outs", [])
            found.update({str(Path(pointer).parent / out["path"]): out.get("md5", "") for out in outs})
        first = [p for p in LINEAGE_FIRST if p in found]
        return {path: found[path] for path in first + sorted(set(found) - set(first))}


# -- the page's data ----------------------------------------------------------------------------------
def pass_history(files: _Files, ws: Workspace, iterations: dict[int, str | None], upto: int,
                 evaluation: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Candidate (and champion) pass@1 per iteration up to ``upto``: the warm start as iteration 0,
    earlier iterations from their experiments' metrics/evaluate.json, ``upto`` from its evaluation."""

    rows: list[dict[str, Any]] = []
    if ws.warmstart_eval.exists():
        summary = json.loads(ws.warmstart_eval.read_text())["summary"]
        rows += _summary_rows(0, summary, None)
    dvc = DvcWorkspace(ws.root)
    for iteration, experiment in iterations.items():
        if iteration >= upto or experiment is None:
            continue
        text = git_try(ws.root, "show", f"{dvc.experiment_rev(experiment)}:./{EVALUATE_METRICS}", strip=False)
        if text:
            rows += _metric_rows(iteration, json.loads(text))
    if evaluation:
        rows += _summary_rows(upto, evaluation["candidate"]["summary"], evaluation["champion"]["summary"])
    return rows


def _summary_rows(iteration: int, candidate: dict, champion: dict | None) -> list[dict[str, Any]]:
    def figures(summary: dict | None) -> dict[str, float]:
        if summary is None:
            return {}
        return {"overall": summary["overall"]["pass@1"],
                **{name: f["pass@1"] for group in ("envs", "slices") for name, f in summary.get(group, {}).items()}}

    cand, champ = figures(candidate), figures(champion)
    return [{"iteration": iteration, "name": name, "candidate": value, "champion": champ.get(name)}
            for name, value in cand.items()]


def _metric_rows(iteration: int, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """metrics/evaluate.json ("candidate_pass@1", "candidate_pass@1/<env>[/<slice>]") as history rows."""
    rows = []
    for key, value in metrics.items():
        role, _, name = key.partition("/")
        if role == "candidate_pass@1":
            champion = metrics.get("champion_pass@1" + (f"/{name}" if name else ""))
            rows.append({"iteration": iteration, "name": name or "overall", "candidate": value, "champion": champion})
    return rows


def feedback_versions(rewards: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each feedback source the batch's rows name, with the versions they name (one, unless a source
    changed within the batch)."""
    found: dict[str, set[str]] = {}
    for row in rewards:
        for name, version in (row.get("sources") or row.get("feedback_sources") or {}).items():
            found.setdefault(name, set()).add(str(version))
    return {name: sorted(found[name]) for name in sorted(found)}


def choose_iteration(ws: Workspace, iterations: dict[int, str | None], iteration: int | None) -> int:
    """``iteration``, or the last one recorded; ReportError naming the iterations that exist."""
    if not iterations:
        raise ReportError(f"{ws.root}: no iteration has been recorded yet (run `closedloop run` first)")
    if iteration is None:
        return max(iterations)
    if iteration not in iterations:
        raise ReportError(f"iteration {iteration} has no record in {ws.root}; the iterations that exist: "
                          + ", ".join(map(str, iterations)))
    return iteration


def load_page(ws: Workspace, loop_iteration: int, iteration: int | None = None,
              mlflow: dict[str, Any] | None = None) -> PageData:
    """The page's data for ``iteration`` (default: the last one recorded). ReportError naming the
    iterations that exist when it is not one of them."""
    iterations = recorded_iterations(ws, loop_iteration)
    iteration = choose_iteration(ws, iterations, iteration)
    experiment = iterations[iteration]
    in_workspace = iteration == loop_iteration and ws.gate.exists()
    files = _Files(ws, experiment, in_workspace)
    evaluation = files.json(paths.EVALUATION)
    rewards = files.jsonl(paths.REWARDS)
    git_rev = files.dvc.head_rev() if in_workspace or not experiment else \
        (_git_parent(ws.root, files.rev) or "")
    return PageData(
        iteration=iteration, experiment=experiment, exp_rev=files.rev, git_rev=git_rev,
        read_from="the workspace" if in_workspace else f"DVC experiment {experiment}",
        samples=files.jsonl(paths.SAMPLES), rewards=rewards, gate=files.json(paths.GATE), evaluation=evaluation,
        monitors=files.json(MONITORS), history=pass_history(files, ws, iterations, iteration, evaluation),
        hashes=files.hashes(), sources=feedback_versions(rewards), mlflow=dict(mlflow or {}),
    )


def _git_parent(root: Path, rev: str) -> str | None:
    return git_try(root, "rev-parse", f"{rev}^")


def mlflow_lineage(ws: Workspace, params, iteration: int) -> dict[str, Any]:
    """The iteration's MLflow run and the model version registered from it, looked up in the store
    (for `closedloop report`; the loop passes what it just logged). {} when the store has none; an
    unreachable store is said in ``error``."""

    try:
        check_store(ws.root, params.tracking.uri, timeout_s=5.0)
        tracking.configure(ws.root, params.tracking.uri, params.tracking.experiment)
        runs = tracking.find_runs(params.tracking.experiment, run_key(ws.root, iteration, "iteration"), status="FINISHED")
        if not runs:
            return {}
        found = tracking.run_location(runs[0])
        registered = params.tracking.registered_model
        version = tracking.find_model_version(registered, {"iteration": str(iteration)})
        parent = tracking.model_version_tags(registered, version).get("parent.version") if version else None
        return {**found, "model_version": version, "parent_version": parent, "registered_model": registered}
    except Exception as error:  # noqa: BLE001  (the page stands without it; it says why)
        return {"error": f"{type(error).__name__}: {error}"}


def report_html(ws: Workspace, loop_iteration: int, iteration: int | None = None,
                mlflow: dict[str, Any] | None = None) -> tuple[str, PageData]:
    data = load_page(ws, loop_iteration, iteration, mlflow)
    return render(data), data


def write_report(ws: Workspace, loop_iteration: int, out: Path, iteration: int | None = None,
                 mlflow: dict[str, Any] | None = None) -> tuple[PageData, float]:
    """Write the page to ``out`` whole or not at all; return its data and the seconds it took."""
    started = time.perf_counter()
    page, data = report_html(ws, loop_iteration, iteration, mlflow)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    scratch.write_text(page, encoding="utf-8")
    os.replace(scratch, out)
    return data, time.perf_counter() - started
