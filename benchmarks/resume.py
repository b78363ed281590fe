"""What the loop's safety nets cost: the workspace lock, pre-flight, the git clean-up after a killed
`dvc exp save`, DVC's stage status (what resume asks per stage), and a resumed run that finds
everything done.

Runs the warm start and one iteration on a fresh tiny workspace (the TINY params of tests/tiny.py),
then times each check ``--repeat`` times and prints the median and the worst, and the resume overhead
against the baseline it names: the iteration's own wall time (the check's share of one iteration).

    python benchmarks/resume.py                 # ~2 min on 2 cores
    python benchmarks/resume.py --repeat 20 --workspace /tmp/resume-ws
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.tiny import TINY  # noqa: E402  (the same tiny workspace as the tests and the soak)


def timed(fn, repeat: int) -> tuple[float, float]:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), max(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workspace", type=Path, help="where to build the workspace (default: a temp dir)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="closedloop-resume-"))
    root = (args.workspace or scratch / "ws").resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ.update({"OMP_WAIT_POLICY": "PASSIVE", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "240",
                       "PREFECT_HOME": str(scratch / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_LOGGING_LEVEL": "WARNING"})
    os.environ.pop("PREFECT_API_URL", None)
    import yaml

    from closedloop.config import load_params
    from closedloop.lineage.dvc import DvcWorkspace
    from closedloop.lineage.preflight import preflight
    from closedloop.pipeline import ITERATION_STAGES
    from closedloop.runlock import workspace_lock
    from closedloop.scaffold import init_workspace

    (root / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    init_workspace(root)
    from flows.iteration import iteration_flow
    from flows.loop import closed_loop

    closed_loop(iterations=0, workspace=str(root))
    started = time.perf_counter()
    iteration_flow(workspace=str(root))
    iteration_s = time.perf_counter() - started
    params = load_params(root)
    dvc = DvcWorkspace(root)

    def lock_cycle():
        with workspace_lock(root, command="benchmark"):
            pass

    rows = [("workspace lock: take + release", timed(lock_cycle, args.repeat)),
            ("pre-flight (benchmark, champion, replay, store)", timed(lambda: preflight(root, params), args.repeat)),
            ("git clean-up after a killed exp save (none)", timed(dvc.clean_interrupted_git_state, args.repeat))]
    per_stage = {name: timed(lambda name=name: dvc.stage_up_to_date(name), args.repeat) for name in ITERATION_STAGES}
    assert all(dvc.stage_up_to_date(name) for name in ITERATION_STAGES), "a finished iteration must be up to date"
    rows.append((f"DVC stage status, all {len(ITERATION_STAGES)} stages",
                 (sum(m for m, _ in per_stage.values()), sum(w for _, w in per_stage.values()))))
    width = max(len(name) for name, _ in rows) + 2
    print(f"one tiny iteration (the baseline): {iteration_s:.1f} s\n")
    print(f"{'check':<{width}} {'median ms':>10} {'worst ms':>9} {'share of the iteration':>23}")
    for name, (median, worst) in rows:
        print(f"{name:<{width}} {median * 1000:>10.1f} {worst * 1000:>9.1f} {median / iteration_s:>22.2%}")
    print("\nper stage (ms): " + ", ".join(f"{name} {median * 1000:.0f}" for name, (median, _) in per_stage.items()))
    resume_s = sum(m for m, _ in per_stage.values()) + rows[1][1][0] + rows[2][1][0]
    print(f"\na resumed run that finds the whole iteration done spends {resume_s:.2f} s on these checks "
          f"= {resume_s / iteration_s:.1%} of the iteration it does not redo")
    return 0


if __name__ == "__main__":
    sys.exit(main())
