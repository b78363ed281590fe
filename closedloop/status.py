"""`closedloop status`: the champion and the last iterations, with scores and data versions."""

from __future__ import annotations

from pathlib import Path

from closedloop.config import Params
from closedloop.lineage import tracking
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.run_metrics import CHAMPION_PASS_AT_1, PASS_AT_1
from closedloop.models.loading import model_fingerprint
from closedloop.pipeline import STAGE_NAMES
from closedloop.progress import read_progress
from closedloop.rescore import stale_batches
from closedloop.rewards.sources import feedback_sources
from closedloop.runlock import describe, holder, is_held
from closedloop.workspace import Workspace


def status_text(root: Path, params: Params, limit: int = 10) -> str:
    uri = tracking.configure(root, params.tracking.uri, params.tracking.experiment)
    name = params.tracking.registered_model
    lines = [f"workspace   {root}", f"tracking    {uri}", f"iteration   {params.loop.iteration} (params.yaml)"]
    lines += _run_state(root)
    champion = tracking.get_alias(name, "champion")
    if champion is None:
        lines.append("champion    none yet (run `closedloop run`)")
    else:
        tags = tracking.model_version_tags(name, champion)
        lines.append(f"champion    {name} v{champion}  iteration {tags.get('iteration', '?')}  "
                     f"benchmark pass@1 {tags.get('benchmark.pass_at_1', '?')}  model {tags.get('dvc.model', '?')[:12]}")
    champion_dir = Workspace.at(root).champion
    if (champion_dir / "config.json").is_file():
        # The name an external inference server may serve the champion under (sample.server.url).
        lines.append(f"champion    {champion_dir}  fingerprint {model_fingerprint(champion_dir)}")
    challenger = tracking.get_alias(name, "challenger")
    if challenger is not None:
        lines.append(f"challenger  {name} v{challenger}")
    runs = tracking.recent_iterations(params.tracking.experiment, limit=limit)
    if runs:
        lines.append("")
        lines.append(f"{'run':<28} {'status':<9} {'candidate':>9} {'champion':>9} {'promoted':>8}  data (dvc samples / train_set)")
        for run in runs:
            metrics, tags = run["metrics"], run["tags"]
            # the names before lineage.run_metrics, for runs an older closedloop logged
            cand = _first(metrics, PASS_AT_1, "evaluate.candidate_pass_at_1", "warmstart.benchmark_pass_at_1")
            champ = _first(metrics, CHAMPION_PASS_AT_1, "evaluate.champion_pass_at_1")
            lines.append(
                f"{run['run_name']:<28} {run['status']:<9} {_fmt(cand):>9} {_fmt(champ):>9} "
                f"{tags.get('promoted', '-'):>8}  {tags.get('dvc.samples', '-')[:10]} / {tags.get('dvc.train_set', '-')[:10]}"
            )
    experiments = DvcWorkspace(root).experiments()
    if experiments:
        lines.append("")
        lines.append("dvc experiments: " + ", ".join(sorted(experiments)))
        lines.append("restore one with `dvc exp apply NAME`, then `dvc repro` reproduces it")
        lines += stale_lines(root, params)
    return "\n".join(lines)


def stale_lines(root: Path, params: Params) -> list[str]:
    """The stored batches today's verifiers would score differently: the versions each iteration's
    reward stage recorded against today's, from git alone (one `git show` per iteration)."""

    try:
        today = feedback_sources(params)
    except ValueError as error:  # a source or environment params.yaml names cannot be loaded now
        return [f"stale batches: unknown ({error})"]
    stale = stale_batches(root, today)
    if not stale:
        return []
    lines = [f"stale batches: {len(stale)} scored by older verifier versions (re-score one to see what changed)"]
    for name, changed in stale:
        lines.append(f"  {name} ({', '.join(changed)} changed) — closedloop rescore --experiment {name}")
    return lines


def _run_state(root: Path) -> list[str]:
    """Who holds the workspace, and an iteration a run left unfinished."""

    lines = []
    record = holder(root)
    held = bool(record) and is_held(root)
    if record:
        lines.append(f"running     {describe(record)}" if held else
                     f"lock        stale: {describe(record)} ended without releasing it (the next run takes it over)")
    progress = read_progress(root)
    if progress is not None and progress.state != "done":
        at = f" at {progress.stage}" if progress.stage else ""
        done = ", ".join(name for name in STAGE_NAMES if name in progress.completed) or "no stage"
        if held and progress.state == "running":
            lines.append(f"in progress iteration {progress.iteration}{at} ({done} done)")
        else:
            verdict = "`closedloop run` resumes it" if progress.resumable() else "the next run starts a new iteration"
            lines.append(f"unfinished  iteration {progress.iteration}: {progress.state}{at} ({done} done); {verdict}")
    return lines


def _first(metrics: dict, *names: str):
    return next((metrics[name] for name in names if name in metrics), None)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"
