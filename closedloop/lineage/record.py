"""Versioning steps that are not DVC stages: closing the loop, and recording each iteration.

These run after the stages (never inside `dvc repro`), so reproducing an iteration does not register
models again. DVC is driven through lineage.dvc and MLflow through lineage.tracking only.
"""

from __future__ import annotations

import json
from typing import Any

from closedloop import workspace as paths
from closedloop.config import Params, write_params
from closedloop.evaluation.report import decision_sentence, warm_start_sentence
from closedloop.faults import armed, fault_point, kill_now
from closedloop.faults import delay_s as fault_delay_s
from closedloop.io import read_json, read_jsonl, replace_dir, say, write_json
from closedloop.lineage import tracking
from closedloop.lineage import tracking as store
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.preflight import check_tracking_store
from closedloop.lineage.preflight import preflight as check
from closedloop.lineage.run_metrics import headline, run_figures
from closedloop.lineage.tracking import DatasetInput
from closedloop.models.loading import model_fingerprint
from closedloop.pipeline import ITERATION_STAGES, stage_spec
from closedloop.progress import Progress, read_progress, stage_completed, started_ms, update_progress, write_progress
from closedloop.report_page import report_html
from closedloop.review.labels import inbox_rows_for, merge_inbox, queued_answers
from closedloop.rewards.sources import feedback_sources
from closedloop.stage_files import stage_result, timing_path
from closedloop.training.candidate_record import untrained_reason
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


def has_champion(ws: Workspace) -> bool:
    return (ws.root / (paths.CHAMPION + ".dvc")).exists() and ws.champion.exists()


def close_loop(ws: Workspace, closed: str | None = None) -> str:
    """Make the model the last iteration promoted (or the warm start) this iteration's champion input;
    return its fingerprint.

    ``closed`` is the champion an unfinished iteration already closed its loop on (its progress
    record): resumed after its own promote stage wrote data/models/next_champion, the iteration must
    keep the champion it started from, not take its own candidate. Otherwise the champion is always
    recorded again with `dvc add` (cheap when unchanged): a kill between copying it and recording it
    must not leave a data/champion.dvc that names the previous champion."""

    if closed is not None and has_champion(ws) and model_fingerprint(ws.champion) == closed:
        record_labels(ws)
        return closed
    source = ws.next_champion if ws.next_champion.exists() else ws.warmstart_model
    wanted = model_fingerprint(source)
    if not ws.champion.exists() or model_fingerprint(ws.champion) != wanted:
        replace_dir(source, ws.champion)
    DvcWorkspace(ws.root).add(paths.CHAMPION, *ensure_labels(ws))
    return wanted


def ensure_labels(ws: Workspace) -> tuple[str, ...]:
    """The human labels and known hacks files, and the review outcome the gate reads (dvc.yaml deps):
    created empty when missing, so they exist from the first iteration on, answered or not.

    A file DVC recorded (its .dvc pointer is there) that is missing now is not made anew: recording an
    empty file would erase every label and known hack from the next version."""
    for relative in (paths.HUMAN_LABELS, paths.KNOWN_HACKS):
        path = ws.root / relative
        if not path.exists():
            if (ws.root / f"{relative}.dvc").exists():
                raise FileNotFoundError(f"{relative} is missing, but {relative}.dvc records it: restore it with "
                                        f"`dvc checkout {relative}` (or `dvc pull {relative}`) before the next run")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    if not ws.review_outcome.exists():

        write_json(ws.review_outcome, {"iteration": None, "mode": "off", "state": "not_requested",
                                       "reviewers": [], "answers": []})
    return paths.HUMAN_LABELS, paths.KNOWN_HACKS, paths.REVIEW_OUTCOME


def record_labels(ws: Workspace) -> None:
    """`dvc add` the labels as they are now: the answers a review appended since the last iteration
    become this iteration's input, a version of their own."""
    DvcWorkspace(ws.root).add(*ensure_labels(ws))


def merge_reviews(ws: Workspace, params: Params, resuming: bool = False) -> dict[str, Any]:
    """At an iteration's start, under the lock: the review answers queued since the last iteration
    (the inbox) move into the labels file and the known hacks, each answered sample goes to MLflow as
    a trace with the reviewer's and the verifier's assessments, and the iteration's review outcome
    starts as "not yet asked". close_loop then records all three with `dvc add`.

    A resumed iteration merges nothing: its inputs must be what its first attempt read, and answers
    about its own batch (queued while it ran, or given to its review before the kill) must stay in
    the inbox for its gate and for the next iteration."""

    ensure_labels(ws)
    counts = {"merged": 0, "duplicates": 0, "known_hacks": 0, "torn": 0}
    if not resuming:
        queued = queued_answers(ws)
        if queued:
            # Before the merge empties the inbox: traces are looked up by answer id, so a run killed
            # after logging them logs nothing twice; one that fails to log them keeps the answers.
            try:
                _tracking(ws, params).log_review_traces(ws.root, params.tracking.uri, params.tracking.experiment,
                                                         queued)
            except Exception as error:  # noqa: BLE001  (a view of the labels; the labels file is the record)
                say(f"closedloop: warning: the review answers could not be logged as MLflow traces: {error}")
        counts = merge_inbox(ws)
        if counts["merged"]:
            say(f"closedloop: {counts['merged']} review answer(s) merged into {paths.HUMAN_LABELS}"
                + (f", {counts['known_hacks']} new known reward hack(s)" if counts["known_hacks"] else "")
                + "; this iteration's reward stage reads them as the human component")
        if counts["torn"]:
            say(f"closedloop: warning: {counts['torn']} review answer(s) cut short by a kill were dropped")
    outcome = read_json(ws.review_outcome)
    if outcome.get("iteration") != params.loop.iteration:  # a resumed iteration keeps what its review said
        write_review_outcome(ws, params, state="pending" if params.review.mode == "before_promotion"
                             else "not_requested", answers=[])
    return {key: value for key, value in counts.items() if key != "answers"}


def review_settled(ws: Workspace, iteration: int) -> bool:
    """Whether this iteration's review before promotion already came back (a resumed run skips it)."""
    outcome = read_json(ws.review_outcome) if ws.review_outcome.exists() else {}
    return outcome.get("iteration") == iteration and outcome.get("state") not in (None, "pending", "not_requested")


def write_review_outcome(ws: Workspace, params: Params, state: str, answers: list[dict[str, Any]]) -> dict:
    """data/reports/review.json: what the review of this iteration's batch said before its gate."""

    outcome = {"iteration": params.loop.iteration, "mode": params.review.mode, "state": state,
               "reviewers": sorted({row["reviewer"] for row in answers}),
               "answers": [{key: row[key] for key in ("answer_id", "sample_id", "env", "reviewer", "score",
                                                      "label", "comment", "verifier") if key in row}
                           for row in answers]}
    write_json(ws.review_outcome, outcome)
    return outcome


def record_review(ws: Workspace, params: Params, review: dict[str, Any]) -> dict:
    """After a review before promotion: the answers this iteration's batch received (from the form, the
    API or `closedloop review`, all waiting in the inbox until the next iteration) become the gate's
    input, recorded with `dvc add`."""

    answers = inbox_rows_for(ws, params.loop.iteration)
    state = "answered" if answers else ("timed_out" if review.get("state") == "timed_out" else review.get("state", ""))
    outcome = write_review_outcome(ws, params, state, answers)
    DvcWorkspace(ws.root).add(paths.REVIEW_OUTCOME)
    return outcome


def recover_git_state(ws: Workspace) -> list[str]:
    """First thing a run does once it holds the lock, before anything reads params.yaml or the
    progress record: a `dvc exp save` killed midway can leave those files reset or cut short."""
    notes = [f"cleaned after an interrupted `dvc exp save`: {what}"
             for what in DvcWorkspace(ws.root).clean_interrupted_git_state()]
    for note in notes:
        say(f"closedloop: {note}")
    return notes


def begin_iteration(ws: Workspace, params: Params, previous: Params,
                    flow_run_ids: list[str] | None = None) -> tuple[Params, Progress]:
    """The iteration this run works on, written to params.yaml (the stages read it from there).

    An iteration a run left unfinished (killed, cancelled, crashed, or failed other than by a refused
    batch; see closedloop.progress) is continued: same number, so the same seeds. Otherwise the next
    number. The progress record is written before params.yaml, so a kill between the two resumes the
    number the record names and no iteration number is ever skipped."""
    import shutil

    nxt = params.model_copy(deep=True)
    progress = read_progress(ws.root)
    last = previous.loop.iteration
    if progress is not None and progress.resumable() and progress.iteration in (last, last + 1) and progress.iteration:
        nxt.loop.iteration = progress.iteration
        progress.attempts += 1
        say(f"closedloop: resuming iteration {progress.iteration} (it was {progress.state}"
            + (f" at {progress.stage}" if progress.stage else "")
            + (f": {progress.reason}" if progress.reason else "") + f"; attempt {progress.attempts})")
        progress.state, progress.reason = "running", None
    else:
        nxt.loop.iteration = last + 1
        progress = Progress(iteration=nxt.loop.iteration)
        # A fresh iteration trains from its own start: a checkpoint an abandoned one left is not its own.
        stale = ws.candidate.with_name("candidate.checkpoint")
        if stale.exists():
            shutil.rmtree(stale)
            say(f"closedloop: removed {stale.relative_to(ws.root)}: a checkpoint of an earlier, abandoned "
                "iteration")
    progress.flow_run_ids = list(flow_run_ids or [])
    write_progress(ws.root, progress)
    if nxt.train.replay.last:
        # The batches replayed are the last N iterations' experiments, named in params.yaml so that
        # `dvc repro` of this iteration reads the same ones.
        nxt.train.replay.versions = replay_versions(ws, nxt) if params.versioning.save_experiments else []
    # The batches the monitors compare this one with, named the same way for the same reason.
    nxt.monitors.versions = (recent_experiments(ws, nxt.loop.iteration, nxt.monitors.history)
                             if params.versioning.save_experiments and nxt.monitors.enabled else [])
    write_params(ws.root, nxt)
    return nxt, progress


def replay_versions(ws: Workspace, params: Params) -> list[str]:
    """The experiments of iterations ``loop.iteration - train.replay.last`` .. ``loop.iteration - 1``,
    oldest first. Where an iteration was saved more than once (it was re-run), its newest save counts."""
    return recent_experiments(ws, params.loop.iteration, params.train.replay.last)


def recent_experiments(ws: Workspace, current: int, last: int) -> list[str]:
    """The experiments of iterations ``current - last`` .. ``current - 1`` (from 1), oldest first; an
    iteration saved more than once (re-run) counts by its newest save, one never saved is left out."""
    if last <= 0:
        return []
    newest = DvcWorkspace(ws.root).iteration_experiments()
    return [newest[i] for i in range(max(1, current - last), current) if i in newest]


def push(ws: Workspace, params: Params) -> int:
    """Send the batch and models to the default DVC remote (`versioning.push`)."""
    return DvcWorkspace(ws.root).push() if params.versioning.push else 0


def _tracking(ws: Workspace, params: Params):
    tracking.configure(ws.root, params.tracking.uri, params.tracking.experiment)
    return tracking


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

    tracking = _tracking(ws, params)
    dvc = DvcWorkspace(ws.root)
    hashes = dvc.lock_hashes()
    evaluation = read_json(ws.warmstart_eval)
    # The warm start becomes the champion without a gate: "promoted" to it, compared with nothing.
    metrics = stage_metrics(ws, ("benchmark", "warmstart"),
                            headline(evaluation["summary"], None, promoted=True, reward_mean=None))
    key = {**tracking.run_key(ws.root, 0, "warmstart"), "closedloop.candidate": evaluation["model_version"]}
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
    (evaluation.report.gate_markdown) names, among it ``run_id``, ``experiment_id``, ``tracking_uri``,
    ``model_version`` and ``parent_version`` (the candidate's and the champion's registry versions),
    ``experiment`` and ``exp_rev`` (DVC), and ``decision`` (the sentence the version's description holds).

    A candidate that trained 0 steps is the champion unchanged: it is not registered and no alias
    moves; the run is tagged with the reason, and the summary carries it (``not_trained``) with
    ``model_version`` None."""
    import statistics

    iteration = params.loop.iteration
    tracking = _tracking(ws, params)
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
    key = {**tracking.run_key(ws.root, iteration, "iteration"), "closedloop.candidate": candidate}
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
    # At most 12, grouped: the lookups (iteration, model.fingerprint), lineage a person filters by,
    # and the batch's DVC hashes as one JSON object. The figures are the source run's metrics.
    tags = {
        "iteration": str(iteration), "model.fingerprint": candidate, **({"parent.version": parent} if parent else {}),
        "training.mode": train.get("mode", ""),
        "training.data": json.dumps({"examples": train.get("examples", {}), "replay": train.get("replay", {})},
                                    sort_keys=True),
        "git.rev": dvc.head_rev(), "dvc.experiment": experiment, "dvc.exp_rev": exp_rev,
        "dvc.model": hashes.get(paths.CANDIDATE, ""),
        "dvc.data": json.dumps({name: hashes.get(relative, "") for name, relative, _ in BATCH_DATASETS},
                               sort_keys=True),
        "feedback_sources": json.dumps(feedback_sources(params), sort_keys=True),
        **_score_tags(gate["candidate"]),
    }
    version, decision = None, decision_sentence(gate, parent)
    if not not_trained:
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


def report_artifact_name(iteration: int) -> str:
    return f"report-iteration-{iteration}.html"


def log_report(ws: Workspace, params: Params, run_id: str, lineage: dict[str, Any]) -> dict[str, Any]:
    """The iteration's report page (closedloop/report_page.py) as the artifact report-iteration-N.html
    of its MLflow run, and its cost as the metric ``timing/report``. Returns {"report_artifact": URI,
    "report_seconds": s}. A page that cannot be rendered or logged is warned about, naming the
    error, and gives {"report_error": ...}: the iteration's records (DVC experiment, run, registry
    version, aliases) are made before it and stay; `closedloop report` can write the page later."""
    import time

    iteration = params.loop.iteration
    started = time.perf_counter()
    try:

        page, _ = report_html(ws, iteration, iteration, lineage)
        tracking = _tracking(ws, params)
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


def end_interrupted_runs(ws: Workspace, params: Params) -> list[str]:
    """End as KILLED the runs of this workspace a killed process left RUNNING (we hold the lock)."""
    tracking = _tracking(ws, params)
    return tracking.end_interrupted_runs(params.tracking.experiment, {"closedloop.workspace": str(ws.root)},
                                         "its process ended before the run did; a later run resumed the iteration")


def preflight(ws: Workspace, params: Params, warm_start: bool = False) -> list[str]:
    """Before the first stage: check that what the iteration reads is present and intact (repairing
    it from the remote where possible; see lineage/preflight.py), and end the MLflow runs killed
    processes left RUNNING. Returns (and prints) what it did; raises PreflightError naming every
    problem it could not repair. (The git state a killed `dvc exp save` left is cleaned earlier, when
    the run takes the lock: recover_git_state.)"""

    # The warm start has no benchmark or champion yet to check, but records into the same store.
    notes = check_tracking_store(ws.root, params) if warm_start else check(ws.root, params)
    ended = end_interrupted_runs(ws, params)
    if ended:
        notes.append(f"ended {len(ended)} MLflow run(s) a killed run left RUNNING as KILLED: {', '.join(ended)}")
    for note in notes:
        say(f"closedloop: {note}")
    return notes


def stage_done(ws: Workspace, stage: str) -> bool:
    """DVC's own verdict: the stage's recorded deps, params and outs all match the workspace."""
    done = DvcWorkspace(ws.root).stage_up_to_date(stage)
    if done:
        note_stage(ws, stage, done=True)  # recorded with its output hashes, as a stage that just ran
    return done


def note_stage(ws: Workspace, stage: str, done: bool) -> None:
    """The progress record follows the stages: which one runs, and each one's recorded outputs."""

    if not done:
        update_progress(ws.root, stage=stage)
        return
    hashes = DvcWorkspace(ws.root).lock_hashes()
    stage_completed(ws.root, stage, {out: hashes.get(out, "") for out in stage_spec(stage).outs})


def closed_loop_on(ws: Workspace, champion: str) -> None:
    """The progress record keeps the champion the iteration closed its loop on (close_loop's ``closed``)."""

    update_progress(ws.root, champion=champion)


def finish_iteration(ws: Workspace) -> None:
    update_progress(ws.root, state="done", stage=None, reason=None)


def record_failure(ws: Workspace, params: Params, stage: str, error: BaseException | str,
                   state: str = "failed", final: bool = False, iteration: int | None = None) -> str:
    """Log an iteration that stopped (a batch that failed validation, a stage that raised, a run
    cancelled or crashed) and mark it so in the progress record; registers nothing. Never raises:
    the error being recorded is the one that matters.

    ``state`` is ``failed`` (run status FAILED) or ``cancelled`` / ``crashed`` (KILLED). The next
    ``closedloop run`` resumes it, unless it is ``final`` (validation refused the batch)."""

    update_progress(ws.root, state=state, stage=stage, reason=str(error)[:4000], final=final)
    iteration = params.loop.iteration if iteration is None else iteration
    try:

        # an unreachable server would cost MLflow's retries (minutes) before this fails anyway
        store.check_store(ws.root, params.tracking.uri, timeout_s=5.0)
        tracking = _tracking(ws, params)
        artifacts = [p for p in (ws.validation_report, ws.validation_dir / "docs") if stage == "validate" and p.exists()]
        return tracking.log_iteration(
            iteration=iteration, run_name=f"iteration-{iteration:03d}-{state}",
            params=params.model_dump(mode="json"), metrics={},
            tags={**tracking.run_key(ws.root, iteration, "iteration"), "closedloop.state": state,
                  "closedloop.failed_stage": stage, "closedloop.error": str(error)[:4000]},
            rewards=[], datasets=[], artifacts=artifacts, stage_seconds={},
            status="FAILED" if state == "failed" else "KILLED",
        )
    except Exception as failure:  # noqa: BLE001
        say(f"closedloop: warning: could not record the {state} iteration {iteration} in MLflow: {failure}")
        return ""

