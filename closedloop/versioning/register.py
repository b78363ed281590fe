"""Recording an iteration after its stages (never inside `dvc repro`, so reproducing it registers
nothing again): the DVC experiment, the MLflow run with its datasets and report page, the registered
candidate and the aliases the gate moved; and the warm start as the first champion."""

from __future__ import annotations

import json
from typing import Any

from closedloop import workspace as paths
from closedloop.config import Params
from closedloop.faults import armed, fault_point, kill_now
from closedloop.faults import delay_s as fault_delay_s
from closedloop.io import read_json, read_jsonl, say
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.mlflow_layout import DatasetInput, run_key
from closedloop.lineage.run_metrics import headline, run_figures
from closedloop.pipeline import ITERATION_STAGES
from closedloop.progress import read_progress, started_ms
from closedloop.reports.gate_report import decision_sentence, warm_start_sentence
from closedloop.reports.page import report_html
from closedloop.rewards.sources import feedback_sources
from closedloop.stage_files import stage_result, timing_path
from closedloop.training.candidate_record import untrained_reason
from closedloop.versioning.store import open_store
from closedloop.workspace import Workspace

# The batch files logged as MLflow dataset inputs, with the context each plays.
BATCH_DATASETS = (
    ("tasks", paths.TASKS, "generation"),
    ("samples", paths.SAMPLES, "rollouts"),
    ("rewards", paths.REWARDS, "feedback"),
    ("graded", paths.GRADED, "grading"),
    ("fixes", paths.FIXES, "training"),
    ("train_set", paths.TRAIN_SET, "training"),
    ("train_rounds", paths.TRAIN_ROUNDS, "training"),  # grpo's on-policy rounds: sampled and scored in train
    ("benchmark", paths.BENCHMARK_TASKS, "evaluation"),
)


def push(ws: Workspace, params: Params) -> int:
    """Send the batch and models to the default DVC remote (`versioning.push`)."""
    return DvcWorkspace(ws.root).push() if params.versioning.push else 0


def stage_metrics(ws: Workspace, stages: tuple[str, ...], headline: dict[str, float] | None = None) -> dict[str, float]:
    """The run's figures: ``headline`` first, then ``stage/<stage>/...``, ``timing/<stage>`` and
    ``system/<stage>/...`` of each stage that ran (names: lineage.run_metrics)."""

    numbers, timings = {}, {}
    for stage in stages:
        if ws.metrics(stage).exists():
            numbers[stage] = read_json(ws.metrics(stage))
        timing = ws.root / timing_path(stage)  # absent for a stage run before timing files existed
        if timing.exists():
            timings[stage] = read_json(timing)
            numbers.setdefault(stage, {})
    return run_figures(numbers, timings, headline or {})


def _datasets(ws: Workspace, hashes: dict[str, str], names=BATCH_DATASETS):
    import pandas as pd

    inputs = []
    for name, relative, context in names:
        path = ws.root / relative
        if path.exists():
            # token ids and log-probabilities stay in the DVC-tracked file: long lists, no use as columns
            frame = pd.DataFrame(read_jsonl(path)).drop(columns=["token_ids", "logprobs"], errors="ignore")
            inputs.append(DatasetInput(name=name, path=relative, digest=hashes.get(relative, "")[:36],
                                       context=context, frame=frame))
    return inputs


def register_warm_start(ws: Workspace, params: Params) -> str:
    """Iteration 0: log the warm start and register it as the first champion."""

    tracking = open_store(ws, params)
    dvc = DvcWorkspace(ws.root)
    hashes = dvc.lock_hashes()
    evaluation = read_json(ws.warmstart_eval)
    # The warm start becomes the champion without a gate: "promoted" to it, compared with nothing.
    metrics = stage_metrics(ws, ("benchmark", "warmstart"),
                            headline(evaluation["summary"], None, promoted=True, reward_mean=None))
    key = {**run_key(ws.root, 0, "warmstart"), "closedloop.candidate": evaluation["model_version"]}
    logged = tracking.find_runs(params.tracking.experiment, key, status="FINISHED")
    run_id = logged[0] if logged else tracking.log_iteration(
        iteration=0, run_name="iteration-000-warmstart", params=params.model_dump(mode="json"),
        metrics=metrics, tags=key, rewards=[],
        datasets=_datasets(ws, hashes, (("references", paths.REFERENCES, "training"),
                                        ("benchmark", paths.BENCHMARK_TASKS, "evaluation"))),
        artifacts=[ws.warmstart_eval], stage_seconds={}, started_ms=started_ms(read_progress(ws.root)),
    )
    tags = {
        "iteration": "0", "model.fingerprint": evaluation["model_version"], "training.mode": "sft",
        "git.rev": dvc.head_rev(), "dvc.model": hashes.get(paths.WARMSTART_MODEL, ""),
        "dvc.data": json.dumps({"references": hashes.get(paths.REFERENCES, ""),
                                "benchmark": hashes.get(paths.BENCHMARK_TASKS, "")}, sort_keys=True),
        "feedback_sources": json.dumps(feedback_sources(params), sort_keys=True),
        **_score_tags(evaluation["summary"]),
    }
    registered = params.tracking.registered_model
    version = tracking.find_model_version(registered, {"iteration": "0",
                                                       "model.fingerprint": evaluation["model_version"]})
    if version is None:
        version = tracking.log_and_register_model(run_id=run_id, model_dir=ws.warmstart_model,
                                                  registered_model=registered, tags=tags,
                                                  reference=dvc.reference(paths.WARMSTART_MODEL),
                                                  log_weights=params.tracking.log_weights)
    tracking.describe_model_version(registered, version, warm_start_sentence(evaluation["summary"]))
    tracking.set_alias(registered, "champion", version)
    tracking.end_run(run_id)
    return version


def _score_tags(summary: dict) -> dict[str, str]:
    # Overall only: the per-environment and per-slice figures are the source run's metrics.
    return {"benchmark.pass_at_1": f"{summary['overall']['pass@1']:.4f}"}


def _parent_version(tracking, registered: str, gate: dict) -> str | None:
    """The registry version of the champion the candidate was compared with: the version registered
    with its fingerprint (found again on a resume, when the champion alias may have moved already)."""
    found = tracking.find_model_version(registered, {"model.fingerprint": gate["champion"]["model_version"]})
    return found or tracking.get_alias(registered, "champion")


def record_iteration(ws: Workspace, params: Params, stage_seconds: dict[str, float]) -> dict[str, Any]:
    """Push the batch, save the iteration as a DVC experiment, log it to MLflow, register the candidate
    and move the aliases as the gate decided. Returns the iteration's summary: what the gate report
    (reports.gate_report.gate_markdown) names, among it ``run_id``, ``experiment_id``, ``tracking_uri``,
    ``model_version`` and ``parent_version`` (the candidate's and the champion's registry versions),
    ``experiment`` and ``exp_rev`` (DVC), and ``decision`` (the sentence the version's description holds).

    A candidate that trained 0 steps is the champion unchanged: it is not registered and no alias
    moves; the run is tagged with the reason, and the summary carries it (``not_trained``) with
    ``model_version`` None."""
    import statistics

    iteration = params.loop.iteration
    tracking = open_store(ws, params)
    dvc = DvcWorkspace(ws.root)
    hashes = dvc.lock_hashes()
    gate = read_json(ws.gate)
    train = stage_result(ws.root, "train")  # its metrics and its info (the mode, why it did not train)
    not_trained = untrained_reason(train)
    candidate = gate["candidate"]["model_version"]
    experiment = f"iter-{iteration:03d}-{candidate[:8]}"
    registered = params.tracking.registered_model
    # Before any alias moves: the champion this iteration's candidate was measured against.
    parent = _parent_version(tracking, registered, gate)
    # Each part below is keyed by the iteration and the candidate, and a part already done is found
    # in its store rather than done again: a run killed anywhere in here is finished by the next one.
    exp_rev = _save_experiment(dvc, experiment) if params.versioning.save_experiments else ""

    rewards = [row["reward"] for row in read_jsonl(ws.graded)]
    promoted = bool(gate["promote"]) and not not_trained
    batch_tags = {f"dvc.{name}": hashes.get(relative, "") for name, relative, _ in BATCH_DATASETS}
    # The batch's Data Docs stay in DVC (data/batch/validation, in the experiment): logged with every
    # run, their 4 MB of identical static files were most of the MLflow store's growth (benchmarks/
    # soak.py). A failed validation logs them (record_failure), where a person will open them.
    artifacts = [ws.gate, ws.evaluation, ws.validation_report]
    key = {**run_key(ws.root, iteration, "iteration"), "closedloop.candidate": candidate}
    logged = tracking.find_runs(params.tracking.experiment, key, status="FINISHED")
    figures = headline(gate["candidate"], gate["champion"], promoted=promoted,
                       reward_mean=statistics.fmean(rewards) if rewards else None)
    # A stage that has no timing file of its own (stage_files) is timed by its task.
    metrics = stage_metrics(ws, ITERATION_STAGES, figures)
    untimed = {name: secs for name, secs in stage_seconds.items() if f"timing/{name}" not in metrics}
    run_id = logged[0] if logged else tracking.log_iteration(
        iteration=iteration, run_name=f"iteration-{iteration:03d}", params=params.model_dump(mode="json"),
        metrics=metrics, rewards=rewards,
        tags={**key, "dvc.experiment": experiment, "dvc.exp_rev": exp_rev, "promoted": str(promoted).lower(),
              **({"closedloop.not_trained": not_trained} if not_trained else {}), **batch_tags,
              **monitor_tags(ws)},
        datasets=_datasets(ws, hashes), artifacts=[a for a in artifacts if a.exists()],
        stage_seconds=untimed, started_ms=started_ms(read_progress(ws.root)),
    )
    tags = _version_tags(params, train, candidate, parent, experiment, exp_rev, dvc.head_rev(), hashes, gate)
    decision = decision_sentence(gate, parent)
    version = None if not_trained else _register_candidate(ws, params, run_id, tags, decision, gate, dvc)
    # After the registry, so the page names the version; before the run ends, so it spans the page too.
    report = log_report(ws, params, run_id, {**tracking.run_location(run_id), "model_version": version,
                                             "parent_version": parent, "registered_model": registered})
    tracking.end_run(run_id)  # the version step ends here: the run spans the whole iteration
    return {
        **report,
        "iteration": iteration, "run_id": run_id, "model_version": version, "experiment": experiment,
        "exp_rev": exp_rev, "not_trained": not_trained, "promoted": promoted,
        "champion_pass@1": gate["champion"]["overall"]["pass@1"],
        "candidate_pass@1": gate["candidate"]["overall"]["pass@1"], "reasons": gate["reasons"],
        "decision": decision, "parent_version": parent,
        "champion_version": tracking.get_alias(registered, "champion"),
        **{k: v for k, v in tracking.run_location(run_id).items() if k in ("tracking_uri", "experiment_id")},
    }


def _version_tags(params: Params, train: dict, candidate: str, parent: str | None, experiment: str,
                  exp_rev: str, git_rev: str, hashes: dict[str, str], gate: dict) -> dict[str, str]:
    """The registered version's tags."""
    iteration = params.loop.iteration
    # At most 12, grouped: the lookups (iteration, model.fingerprint), lineage a person filters by,
    # and the batch's DVC hashes as one JSON object. The figures are the source run's metrics.
    tags = {
        "iteration": str(iteration), "model.fingerprint": candidate, **({"parent.version": parent} if parent else {}),
        "training.mode": train.get("mode", ""),
        "training.data": json.dumps({"examples": train.get("examples", {}), "replay": train.get("replay", {})},
                                    sort_keys=True),
        "git.rev": git_rev, "dvc.experiment": experiment, "dvc.exp_rev": exp_rev,
        "dvc.model": hashes.get(paths.CANDIDATE, ""),
        "dvc.data": json.dumps({name: hashes.get(relative, "") for name, relative, _ in BATCH_DATASETS},
                               sort_keys=True),
        "feedback_sources": json.dumps(feedback_sources(params), sort_keys=True),
        **_score_tags(gate["candidate"]),
    }
    return tags


def _register_candidate(ws: Workspace, params: Params, run_id: str, tags: dict[str, str], decision: str,
                        gate: dict, dvc: DvcWorkspace) -> str:
    """The candidate's registry version (found again on a resume, else registered), described with the
    gate's decision, with the challenger alias and, when the gate promoted it, the champion alias."""
    iteration, candidate = params.loop.iteration, gate["candidate"]["model_version"]
    registered = params.tracking.registered_model
    tracking = open_store(ws, params)
    version = tracking.find_model_version(registered, {"iteration": str(iteration),
                                                       "model.fingerprint": candidate})
    if version is None:
        version = tracking.log_and_register_model(run_id=run_id, model_dir=ws.candidate,
                                                  registered_model=registered, tags=tags,
                                                  reference=dvc.reference(paths.CANDIDATE),
                                                  log_weights=params.tracking.log_weights)
        fault_point("version:register")  # tests kill a run here: registered, no alias moved
    tracking.describe_model_version(registered, version, decision)
    tracking.set_alias(registered, "challenger", version)
    if gate["promote"]:
        tracking.set_alias(registered, "champion", version)
    return version


def report_artifact_name(iteration: int) -> str:
    return f"report-iteration-{iteration}.html"


def log_report(ws: Workspace, params: Params, run_id: str, lineage: dict[str, Any]) -> dict[str, Any]:
    """The iteration's report page (closedloop/reports/page.py) as the artifact report-iteration-N.html
    of its MLflow run, and its cost as the metric ``timing/report``. Returns {"report_artifact": URI,
    "report_seconds": s}. A page that cannot be rendered or logged is warned about, naming the
    error, and gives {"report_error": ...}: the iteration's records (DVC experiment, run, registry
    version, aliases) are made before it and stay; `closedloop report` can write the page later."""
    import time

    iteration = params.loop.iteration
    started = time.perf_counter()
    try:
        page, _ = report_html(ws, iteration, iteration, lineage)
        tracking = open_store(ws, params)
        uri = tracking.log_text_artifact(run_id, page, report_artifact_name(iteration))
        seconds = time.perf_counter() - started
        tracking.log_metrics(run_id, {"timing/report": seconds}, step=iteration)
    except Exception as error:  # noqa: BLE001  (a view of the records; losing them for it would be worse)
        say(f"closedloop: WARNING: the report page of iteration {iteration} was not logged to MLflow "
            f"({type(error).__name__}: {error}); the iteration's records are kept. Write the page with "
            f"`closedloop report --iteration {iteration} --out report.html`")
        return {"report_error": f"{type(error).__name__}: {error}"}
    return {"report_artifact": uri, "report_seconds": seconds}


def monitor_tags(ws: Workspace) -> dict[str, str]:
    """A run tag ``monitor.<name>`` = "fail" or "warn" per monitor that did not pass (the runs table
    filters by them: ``tags.`monitor.anomaly_rates` = 'fail'``), and ``monitors.holding`` naming those
    that held the gate."""
    if not ws.monitors_report.exists():
        return {}
    report = read_json(ws.monitors_report)
    tags = {f"monitor.{m['name']}": m["verdict"] for m in report["monitors"] if m["verdict"] in ("fail", "warn")}
    if report.get("holding"):
        tags["monitors.holding"] = ",".join(report["holding"])
    return tags


def _save_experiment(dvc: DvcWorkspace, experiment: str) -> str:
    """The experiment's commit: saved now, or found where a killed run saved it already."""
    if experiment in dvc.experiments():
        return dvc.experiment_rev(experiment)
    if armed("version:exp-save"):  # tests kill a run while `dvc exp save` is at work
        import threading

        threading.Timer(fault_delay_s(), kill_now).start()
    return dvc.exp_save(experiment)
