"""Where one iteration's time goes: each stage's own work vs. everything around it.

Runs the warm start (untimed), then one iteration through the Prefect flow on a fresh workspace, and
prints each stage's time and the share of the iteration spent outside the stages' own work
(orchestration, DVC recording, MLflow tracking, GX validation). Baseline: the stages' own work.

    python benchmarks/iteration.py            # default params (the built-in policy, as `make run`)
    python benchmarks/iteration.py --small    # a small setting, ~1 min
    python benchmarks/iteration.py --small --iterations 2   # time the 2nd: the monitors compare with the 1st
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
    "envs": {name: {"benchmark": {"core": 6, "edge": 2, "failure_modes": 2, "heldout": 2}}
             for name in ("code", "data", "script", "extract", "rules")},
    "generate": {"n_tasks": 100},
    "warmstart": {"steps": 60},
    "train": {"steps": 20},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a small setting instead of the defaults")
    parser.add_argument("--iterations", type=int, default=1,
                        help="run this many iterations and time the last (from 2 on, the monitors read history)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="build the workspace here and keep it (its metrics/ hold every stage's figures)")
    args = parser.parse_args()
    if args.keep and args.keep.exists():
        parser.error(f"--keep {args.keep}: already exists; name a new directory")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    import yaml

    from closedloop.scaffold import init_workspace

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep.resolve() if args.keep else Path(tmp) / "ws"
        root.mkdir(parents=True)
        (root / "params.yaml").write_text(yaml.safe_dump(SMALL if args.small else {}))
        init_workspace(root)
        from flows.iteration import iteration_flow
        from flows.loop import warm_start_flow

        t = time.perf_counter()
        warm_start_flow(workspace=str(root))
        warm = time.perf_counter() - t
        for _ in range(args.iterations - 1):  # earlier iterations: history for the monitors to read
            iteration_flow(workspace=str(root))
        result = iteration_flow(workspace=str(root))
        report(result["timing"], warm, "small" if args.small else "default")
        parts(root, result["timing"])
        monitors_share(root, result["timing"])
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


def parts(root: Path, timing: dict) -> None:
    """Inside the stages: generation, verification and training throughput, training's budget and
    padding share, the warm start's, and the evaluation's share of the iteration."""
    from closedloop.io import read_json
    from closedloop.stage_files import stage_result, timing_path

    def figures(name: str) -> dict:
        return {**stage_result(root, name), **read_json(root / timing_path(name))}

    sample, reward, train, warm = (figures(n) for n in ("sample", "reward", "train", "warmstart"))
    total = timing["total_seconds"]
    print()
    print(f"sample    {sample['samples']} samples, {sample['completion_tokens']:,} tokens at "
          f"{sample['tokens_per_s']:,.0f} tokens/s ({sample['seconds']:.1f} s with the model load)")
    rates = ", ".join(f"{key.split('/')[1]} {value:,.0f}" for key, value in sorted(reward.items())
                      if key.startswith("verifications_per_s/"))
    print(f"reward    verifications/s per environment: {rates}")
    print(f"train     {train['steps']} steps ({train.get('budget', '?')}); examples {train['examples']}; "
          f"{train['tokens']:,} real tokens at {train['tokens_per_s']:,.0f} tokens/s; padding "
          f"{train.get('padding_share', float('nan')):.1%} of the positions computed (packed: {train.get('packed')})")
    print(f"warmstart {warm['train_steps']} steps at {warm['train_tokens_per_s']:,.0f} tokens/s, padding "
          f"{warm.get('train_padding_share', float('nan')):.1%}; benchmark pass@1 {warm['benchmark_pass@1']:.3f}")
    evaluate = timing["task"].get("evaluate", 0.0)
    print(f"evaluate  {evaluate:.1f} s, {evaluate / total:.1%} of the iteration (champion and candidate, "
          "every benchmark task x evaluate.samples_per_task)")


def monitors_share(root: Path, timing: dict) -> None:
    """What watching the loop costs: the monitors stage (its task, DVC commit included) and the benchmark
    canary the reward stage scores for it (its throughput is in the reward stage's timing file)."""
    from closedloop.io import read_json
    from closedloop.stage_files import timing_path

    total = timing["total_seconds"]
    stage = timing["task"].get("monitors", 0.0)
    reward_timing = read_json(root / timing_path("reward"))
    canary_rows = read_json(root / "metrics/reward.json").get("canary", {}).get("total", 0)
    rate = reward_timing.get("canary/verifications_per_s")
    canary = canary_rows / rate if rate else 0.0
    print(f"monitors stage {stage:.2f} s ({stage / total:.1%}) + benchmark canary {canary:.2f} s "
          f"({canary_rows} verifications, {canary / total:.1%}) = {(stage + canary) / total:.1%} of the iteration "
          "(target < 5%)")


if __name__ == "__main__":
    main()
