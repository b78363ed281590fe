"""Episodes against single attempts, on one model: pass@1 after each round and what a round costs.

Runs the evaluate stage's measurement (evaluation.runner.evaluate_policy) on a workspace's benchmark
tasks twice, with the same seed and samples per task: once single-shot (``sample.rounds: 1``, the
baseline) and once as episodes of ``--rounds`` rounds. Prints pass@1 on the hidden checks after round
1, 2, ..., R, overall and per environment, the correction rate (failed first attempts fixed later),
and the cost: single-shot samples per second against episodes per second and seconds per round.

    python benchmarks/episodes.py WORKSPACE [--model data/models/warmstart] [--rounds 3] [--samples 4] [--trim]

Round 1 of the episodes is scored on the hidden checks only (for code: the calls after the visible
ones), the single-shot run on all checks, so their pass@1 differ by what is checked, not by the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from closedloop.config import load_params
from closedloop.envs.base import load_tasks
from closedloop.evaluation.runner import evaluate_policy
from closedloop.execution.factory import open_executor
from closedloop.rewards.verification import ShardedVerifiers
from closedloop.workspace import Workspace


def measure(params, model_dir: Path, tasks, samples: int, seed: int) -> tuple[dict, float]:
    with open_executor(params) as executor, ShardedVerifiers(params, executor) as verifiers:
        started = time.perf_counter()
        result = evaluate_policy(model_dir, tasks, params=params, samples_per_task=samples, seed=seed,
                                 batch_size=params.evaluate.batch_size, verifiers=verifiers, executor=executor)
        return result, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--model", default="data/models/warmstart", help="model directory, relative to the workspace")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4, help="samples (episodes) per task")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--trim", action="store_true",
                        help="sample.trim_transcript: a transcript too long for the context leaves out its oldest "
                             "attempts instead of ending the episode")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)

    ws = Workspace.at(args.workspace)
    base = load_params(ws.root)
    tasks = load_tasks(ws.benchmark_tasks)
    model_dir = ws.root / args.model
    single_params = base.model_copy(update={"sample": base.sample.model_copy(update={"rounds": 1})})
    episode_params = base.model_copy(update={"sample": base.sample.model_copy(
        update={"rounds": args.rounds, "trim_transcript": args.trim})})
    single, single_s = measure(single_params, model_dir, tasks, args.samples, args.seed)
    episodes, episodes_s = measure(episode_params, model_dir, tasks, args.samples, args.seed)

    n = len(tasks) * args.samples
    rounds = episodes["rounds"]
    by_round = rounds["by_round"]
    envs = sorted(by_round[0]["envs"])
    print(f"model {model_dir} ({episodes['model_version'][:12]}), {len(tasks)} benchmark tasks x {args.samples}")
    print(f"single-shot (baseline): pass@1 {single['summary']['overall']['pass@1']:.3f} on all checks, "
          f"{single_s:.1f} s, {n / single_s:.2f} samples/s")
    header = "after round | overall | " + " | ".join(envs)
    print(header)
    for number, summary in enumerate(by_round, start=1):
        cells = [f"{summary['overall']['pass@1']:.3f}"] + [f"{summary['envs'][e]['pass@1']:.3f}" for e in envs]
        print(f"{number:>11} | " + " | ".join(cells))
    correction = rounds["correction_rate"]
    print(f"correction rate: {correction['fixed']} of {correction['failed_first']} failed first attempts "
          f"fixed later ({correction['rate']:.3f})")
    seconds_per_round = episodes_s / len(rounds["per_round"])
    print(f"episodes: {episodes_s:.1f} s, {n / episodes_s:.2f} episodes/s, {seconds_per_round:.1f} s per round "
          f"(x{episodes_s / single_s:.2f} the single-shot time)")
    for row in rounds["per_round"]:
        print(f"  round {row['round']}: {row['open']} open, {row['sampled']} sampled, "
              f"{row['stopped_for_context']} stopped for context, "
              + (f"{row['trimmed']} trimmed to fit, " if "trimmed" in row else "")
              + f"{row['visible_passed']} passed the visible checks, "
              f"sampling {row['sampling_s']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"single": single, "single_s": single_s, "episodes": episodes,
                                         "episodes_s": episodes_s}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
