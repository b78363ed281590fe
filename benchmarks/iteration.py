"""Where one iteration's time goes: each stage's own work vs. everything around it.

Runs the warm start (untimed), then one iteration through the Prefect flow on a fresh workspace, and
prints each stage's time and the share of the iteration spent outside the stages' own work
(orchestration, DVC recording, MLflow tracking, GX validation). Baseline: the stages' own work.

    python benchmarks/iteration.py            # default params (the built-in policy, as `make run`)
    python benchmarks/iteration.py --small    # a small setting, ~1 min
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMALL = {
    "envs": {name: {"benchmark": {"core": 6, "edge": 2, "failure_modes": 2}}
             for name in ("code", "data", "script", "extract", "rules")},
    "generate": {"n_tasks": 100},
    "warmstart": {"steps": 60},
    "train": {"steps": 20},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a small setting instead of the defaults")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    import yaml

    from closedloop.scaffold import init_workspace

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        (root / "params.yaml").write_text(yaml.safe_dump(SMALL if args.small else {}))
        init_workspace(root)
        from flows.iteration import iteration_flow
        from flows.loop import warm_start_flow

        t = time.perf_counter()
        warm_start_flow(workspace=str(root))
        warm = time.perf_counter() - t
        result = iteration_flow(workspace=str(root))
        report(result["timing"], warm, "small" if args.small else "default")
        print(f"benchmark pass@1: candidate {result['candidate_pass@1']:.3f} vs champion "
              f"{result['champion_pass@1']:.3f} ({'promoted' if result['promoted'] else 'held'})")


def report(timing: dict, warm_s: float, setting: str) -> None:
    total = timing["total_seconds"]
    work = timing["work"]
    own = sum(seconds for name, seconds in work.items() if name != "validate")
    validation = work.get("validate", 0.0)
    dvc = sum(timing["recorded"][n] - work[n] for n in work)
    prefect_tasks = sum(timing["task"][n] - timing["recorded"][n] for n in work)
    version = timing["version_seconds"]
    rest = total - sum(timing["task"].values()) - version
    print(f"setting: {setting}; warm start (untimed in the shares) {warm_s:.1f} s\n")
    print(f"{'stage':<10} {'own work s':>10} {'dvc commit s':>12} {'task s':>8}")
    for name in work:
        print(f"{name:<10} {work[name]:>10.2f} {timing['recorded'][name] - work[name]:>12.2f} {timing['task'][name]:>8.2f}")
    print()
    outside = total - own
    print(f"iteration total              {total:8.2f} s")
    print(f"stages' own work (baseline)  {own:8.2f} s")
    print(f"  validation (GX)            {validation:8.2f} s")
    print(f"  DVC commit of stages       {dvc:8.2f} s")
    print(f"  Prefect task overhead      {prefect_tasks:8.2f} s")
    print(f"  version (DVC push + exp save + MLflow log/register) {version:8.2f} s")
    print(f"  loop bookkeeping + flow    {rest:8.2f} s")
    print(f"share outside the stages' own work: {outside / total:.1%}  (ratio total/own = {total / own:.2f}x)")


if __name__ == "__main__":
    main()
