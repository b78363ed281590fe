"""Versioning steps that are not DVC stages: closing the loop, and recording each iteration.

These run after the stages (never inside `dvc repro`), so reproducing an iteration does not register
models again. DVC is driven through lineage.dvc and MLflow through lineage.tracking only.
"""

from __future__ import annotations

import json
from typing import Any

from closedloop import workspace as paths
from closedloop.config import Params, write_params
from closedloop.io import read_json, read_jsonl, replace_dir
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.workspace import Workspace

# The batch files logged as MLflow dataset inputs, with the context each plays.
BATCH_DATASETS = (
    ("tasks", paths.TASKS, "generation"),
    ("samples", paths.SAMPLES, "rollouts"),
    ("rewards", paths.REWARDS, "feedback"),
    ("graded", paths.GRADED, "grading"),
    ("fixes", paths.FIXES, "training"),
    ("train_set", paths.TRAIN_SET, "training"),
    ("benchmark", paths.BENCHMARK_TASKS, "evaluation"),
)


def has_champion(ws: Workspace) -> bool:
    return (ws.root / (paths.CHAMPION + ".dvc")).exists() and ws.champion.exists()


def close_loop(ws: Workspace) -> str:
    """Make the model the last iteration promoted (or the warm start) this iteration's champion input."""
    from closedloop.models.loading import model_fingerprint

    source = ws.next_champion if ws.next_champion.exists() else ws.warmstart_model
    wanted = model_fingerprint(source)
    if not ws.champion.exists() or model_fingerprint(ws.champion) != wanted or not has_champion(ws):
        replace_dir(source, ws.champion)
        DvcWorkspace(ws.root).add(paths.CHAMPION)
    return wanted


def begin_iteration(ws: Workspace, params: Params, previous: Params) -> Params:
    """params.yaml gets the flow's params with the next iteration number; stages read it from there."""
    nxt = params.model_copy(deep=True)
    nxt.loop.iteration = previous.loop.iteration + 1
    if nxt.train.replay.last:
        # The batches replayed are the last N iterations' experiments, named in params.yaml so that
        # `dvc repro` of this iteration reads the same ones.
        nxt.train.replay.versions = replay_versions(ws, nxt) if params.versioning.save_experiments else []
    write_params(ws.root, nxt)
    return nxt


def replay_versions(ws: Workspace, params: Params) -> list[str]:
    """The experiments of iterations ``loop.iteration - train.replay.last`` .. ``loop.iteration - 1``,
    oldest first. Where an iteration was saved more than once (it was re-run), its newest save counts."""
    import re

    newest: dict[int, str] = {}
    for name in DvcWorkspace(ws.root).experiments_newest_first():
        match = re.fullmatch(r"iter-(\d+)-[0-9a-f]+", name)
        if match:
            newest.setdefault(int(match.group(1)), name)
    current, last = params.loop.iteration, params.train.replay.last
    return [newest[i] for i in range(max(1, current - last), current) if i in newest]


def push(ws: Workspace, params: Params) -> int:
    """Send the batch and models to the default DVC remote (`versioning.push`)."""
    return DvcWorkspace(ws.root).push() if params.versioning.push else 0


def _tracking(ws: Workspace, params: Params):
    from closedloop.lineage import tracking

    tracking.configure(ws.root, params.tracking.uri, params.tracking.experiment)
    return tracking


def _metric_name(key: str) -> str:
    # MLflow metric names allow letters, digits, _ - . / and spaces.
    return key.replace("@", "_at_").replace(":", "_")


def flatten_metrics(prefix: str, data: Any, out: dict[str, float]) -> dict[str, float]:
    if isinstance(data, bool):
        out[_metric_name(prefix)] = float(data)
    elif isinstance(data, (int, float)):
        out[_metric_name(prefix)] = float(data)
    elif isinstance(data, dict):
        for key, value in data.items():
            flatten_metrics(f"{prefix}.{key}" if prefix else str(key), value, out)
    return out


def stage_metrics(ws: Workspace, stages: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for stage in stages:
        path = ws.metrics(stage)
        if path.exists():
            flatten_metrics(stage, read_json(path), out)
    return out


def _datasets(ws: Workspace, hashes: dict[str, str], names=BATCH_DATASETS):
    import pandas as pd

    from closedloop.lineage.tracking import DatasetInput

    inputs = []
    for name, relative, context in names:
        path = ws.root / relative
        if path.exists():
            frame = pd.DataFrame(read_jsonl(path))
            inputs.append(DatasetInput(name=name, path=relative, digest=hashes.get(relative, "")[:36],
                                       context=context, frame=frame))
    return inputs


def register_warm_start(ws: Workspace, params: Params) -> str:
    """Iteration 0: log the warm start and register it as the first champion."""
    from closedloop.rewards.sources import feedback_sources

    tracking = _tracking(ws, params)
    dvc = DvcWorkspace(ws.root)
    hashes = dvc.lock_hashes()
    evaluation = read_json(ws.warmstart_eval)
    metrics = stage_metrics(ws, ("benchmark", "warmstart"))
    run_id = tracking.log_iteration(
        iteration=0, run_name="iteration-000-warmstart", params=params.model_dump(mode="json"),
        metrics=metrics, tags={"closedloop.iteration": "0", "closedloop.kind": "warmstart"}, rewards=[],
        datasets=_datasets(ws, hashes, (("references", paths.REFERENCES, "training"),
                                        ("benchmark", paths.BENCHMARK_TASKS, "evaluation"))),
        artifacts=[ws.warmstart_eval], stage_seconds={},
    )
    tags = {
        "iteration": "0", "training.mode": "sft", "git.rev": dvc.head_rev(),
        "dvc.model": hashes.get(paths.WARMSTART_MODEL, ""), "dvc.references": hashes.get(paths.REFERENCES, ""),
        "dvc.benchmark": hashes.get(paths.BENCHMARK_TASKS, ""), "model.fingerprint": evaluation["model_version"],
        "feedback_sources": json.dumps(feedback_sources(params), sort_keys=True),
        **_score_tags(evaluation["summary"]),
    }
    version = tracking.log_and_register_model(run_id=run_id, model_dir=ws.warmstart_model,
                                              registered_model=params.tracking.registered_model, tags=tags,
                                              reference=dvc.reference(paths.WARMSTART_MODEL),
                                              log_weights=params.tracking.log_weights)
    tracking.set_alias(params.tracking.registered_model, "champion", version)
    return version


def _score_tags(summary: dict) -> dict[str, str]:
    tags = {"benchmark.pass_at_1": f"{summary['overall']['pass@1']:.4f}"}
    for name, figures in [*summary.get("envs", {}).items(), *summary["slices"].items()]:
        tags[f"benchmark.pass_at_1.{name}"] = f"{figures['pass@1']:.4f}"
    return tags


def record_iteration(ws: Workspace, params: Params, stage_seconds: dict[str, float]) -> dict[str, Any]:
    """Push the batch, save the iteration as a DVC experiment, log it to MLflow, register the candidate
    and move the aliases as the gate decided. Returns the iteration's summary.

    A candidate that trained 0 steps is the champion unchanged: it is not registered and no alias
    moves; the run is tagged with the reason, and the summary carries it (``not_trained``) with
    ``model_version`` None."""
    from closedloop.pipeline import ITERATION_STAGES
    from closedloop.rewards.sources import feedback_sources

    iteration = params.loop.iteration
    tracking = _tracking(ws, params)
    dvc = DvcWorkspace(ws.root)
    hashes = dvc.lock_hashes()
    gate = read_json(ws.gate)
    train = read_json(ws.metrics("train"))
    not_trained = None if train.get("trained", True) else (train.get("untrained_reason") or "it trained 0 steps")
    experiment = f"iter-{iteration:03d}-{gate['candidate']['model_version'][:8]}"
    exp_rev = dvc.exp_save(experiment) if params.versioning.save_experiments else ""

    rewards = [row["reward"] for row in read_jsonl(ws.graded)]
    batch_tags = {f"dvc.{name}": hashes.get(relative, "") for name, relative, _ in BATCH_DATASETS}
    artifacts = [ws.gate, ws.evaluation, ws.validation_report, ws.validation_dir / "docs"]
    run_id = tracking.log_iteration(
        iteration=iteration, run_name=f"iteration-{iteration:03d}", params=params.model_dump(mode="json"),
        metrics=stage_metrics(ws, ITERATION_STAGES), rewards=rewards,
        tags={"closedloop.iteration": str(iteration), "closedloop.kind": "iteration",
              "dvc.experiment": experiment, "dvc.exp_rev": exp_rev, "promoted": str(gate["promote"]).lower(),
              **({"closedloop.not_trained": not_trained} if not_trained else {}), **batch_tags},
        datasets=_datasets(ws, hashes), artifacts=[a for a in artifacts if a.exists()],
        stage_seconds=stage_seconds,
    )
    tags = {
        "iteration": str(iteration), "training.mode": train["mode"], "git.rev": dvc.head_rev(),
        "training.data": json.dumps(train.get("examples", {}), sort_keys=True),
        "training.replay": json.dumps(train.get("replay", {}), sort_keys=True),
        "dvc.experiment": experiment, "dvc.exp_rev": exp_rev, "dvc.model": hashes.get(paths.CANDIDATE, ""),
        **batch_tags, "model.fingerprint": gate["candidate"]["model_version"],
        "parent.fingerprint": gate["champion"]["model_version"],
        "feedback_sources": json.dumps(feedback_sources(params), sort_keys=True),
        "gate.promote": str(gate["promote"]).lower(), "gate.reasons": " | ".join(gate["reasons"])[:4000],
        **_score_tags(gate["candidate"]),
    }
    registered = params.tracking.registered_model
    version = None
    if not not_trained:
        version = tracking.log_and_register_model(run_id=run_id, model_dir=ws.candidate,
                                                  registered_model=registered, tags=tags,
                                                  reference=dvc.reference(paths.CANDIDATE),
                                                  log_weights=params.tracking.log_weights)
        tracking.set_alias(registered, "challenger", version)
        if gate["promote"]:
            tracking.set_alias(registered, "champion", version)
    return {
        "iteration": iteration, "run_id": run_id, "model_version": version, "experiment": experiment,
        "not_trained": not_trained,
        "promoted": bool(gate["promote"]) and not not_trained, "champion_pass@1": gate["champion"]["overall"]["pass@1"],
        "candidate_pass@1": gate["candidate"]["overall"]["pass@1"], "reasons": gate["reasons"],
        "champion_version": tracking.get_alias(registered, "champion"),
    }


def record_failure(ws: Workspace, params: Params, stage: str, error: BaseException) -> str:
    """Log a failed iteration (for example a batch that failed validation); registers nothing."""
    tracking = _tracking(ws, params)
    artifacts = [p for p in (ws.validation_report, ws.validation_dir / "docs") if stage == "validate" and p.exists()]
    return tracking.log_iteration(
        iteration=params.loop.iteration, run_name=f"iteration-{params.loop.iteration:03d}-failed",
        params=params.model_dump(mode="json"), metrics={},
        tags={"closedloop.iteration": str(params.loop.iteration), "closedloop.kind": "iteration",
              "closedloop.failed_stage": stage, "closedloop.error": str(error)[:4000]},
        rewards=[], datasets=[], artifacts=artifacts, stage_seconds={}, status="FAILED",
    )


def benchmark_rows(ws: Workspace) -> list[dict[str, Any]]:
    """The benchmark table the flow publishes as a Prefect artifact: one row per model and slice."""
    gate = read_json(ws.gate)
    rows = []
    for role in ("champion", "candidate"):
        summary = gate[role]
        for name, figures in [("overall", summary["overall"]), *summary.get("envs", {}).items(),
                              *summary["slices"].items()]:
            rows.append({"model": role, "version": summary["model_version"], "slice": name,
                         "pass@1": round(figures["pass@1"], 4), "se": round(figures["se"], 4),
                         "tasks": figures["tasks"]})
    return rows
