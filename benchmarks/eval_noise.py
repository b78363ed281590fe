"""How many benchmark samples per task does the gate need? The evaluation's noise, taken apart.

The gate calls a slice's drop a regression when it exceeds both ``gate.slice_tolerance`` and
``gate.noise_z`` standard errors of the difference, the standard errors being over the slice's tasks
(evaluation/stats.py, evaluation/gate.py). A task's pass@1 varies for two reasons: tasks differ in
difficulty (between tasks: more samples do not change it) and each task's figure is the mean of
``evaluate.samples_per_task`` draws (sampling: it shrinks with more samples). This script splits the
observed variance into the two, from one evaluation's per-task counts, and prints the gate's noise
band (``noise_z`` standard errors of the difference) as it would be at 1, 2, 4, ... samples per task,
beside the band of the paired difference (the same tasks in both evaluations, as the gate has them).

Baseline: the band at the workspace's own ``evaluate.samples_per_task``.

    python benchmarks/eval_noise.py WORKSPACE                 # its data/reports/evaluation.json
    python benchmarks/eval_noise.py WORKSPACE --before A.json --after B.json   # any two evaluations
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAMPLES = (1, 2, 4, 8, 16, 32)


def _evaluation(path: Path, role: str) -> dict:
    data = json.loads(path.read_text())
    return data[role] if role in data else data  # evaluation.json holds both roles; a warm start's, one


def variance_parts(scores: list[float], samples: int) -> tuple[float, float]:
    """(between-task variance, sampling variance of one task's figure at ``samples`` draws), estimated
    from per-task pass rates: the sampling part from each task's binomial spread (unbiased), the
    between part as what the observed variance leaves."""
    n = len(scores)
    mean = sum(scores) / n
    observed = sum((s - mean) ** 2 for s in scores) / (n - 1) if n > 1 else 0.0
    if samples < 2:
        return observed, 0.0  # one draw a task: the two cannot be told apart
    sampling = sum(s * (1 - s) for s in scores) / n / (samples - 1)
    return max(0.0, observed - sampling), sampling


def band(groups: dict[str, list[tuple[float, float]]], samples: int, at: int, z: float) -> dict[str, tuple[float, float]]:
    """Per group: (the gate's band: z * hypot of the two standard errors; the paired band: z * the
    standard error of the per-task differences), as they would be at ``at`` samples per task."""
    out = {}
    for name, pairs in groups.items():
        n = len(pairs)
        sides = []
        for index in (0, 1):
            between, sampling = variance_parts([pair[index] for pair in pairs], samples)
            sides.append((between + sampling * samples / at) / n)
        diffs = [after - before for before, after in pairs]
        between_d, _ = variance_parts(diffs, 1)  # the differences' observed variance
        sampling_both = sum(variance_parts([pair[i] for pair in pairs], samples)[1] for i in (0, 1))
        paired = max(0.0, between_d - sampling_both) + sampling_both * samples / at
        out[name] = (z * math.sqrt(sum(sides)), z * math.sqrt(paired / n))
    return out


def main() -> int:
    from closedloop.config import load_params
    from closedloop.envs.base import load_tasks
    from closedloop.workspace import Workspace

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--before", type=Path, help="an evaluation (default: the workspace's, champion)")
    parser.add_argument("--after", type=Path, help="an evaluation (default: the workspace's, candidate)")
    args = parser.parse_args()
    ws = Workspace.at(args.workspace)
    params = load_params(ws.root)
    before = _evaluation(args.before or ws.evaluation, "champion")
    after = _evaluation(args.after or ws.evaluation, "candidate")
    samples = before["samples_per_task"]
    if after["samples_per_task"] != samples:
        parser.error(f"the two evaluations drew {samples} and {after['samples_per_task']} samples per task")
    groups: dict[str, list[tuple[float, float]]] = {"overall": []}
    for task in load_tasks(ws.benchmark_tasks):
        pair = (before["per_task"][task.task_id] / samples, after["per_task"][task.task_id] / samples)
        for name in ("overall", task.env, f"{task.env}/{task.slice}"):
            groups.setdefault(name, []).append(pair)
    z, tolerance = params.gate.noise_z, params.gate.slice_tolerance
    print(f"{samples} samples per task measured; gate.noise_z {z}, gate.slice_tolerance {tolerance}. A drop is a "
          f"regression beyond max(tolerance, band).\n")
    bands = {at: band(groups, samples, at, z) for at in SAMPLES}
    print("| group | tasks | before | after | sampling share of a task's variance | " +
          " | ".join(f"band at {at} (paired)" for at in SAMPLES) + " |")
    print("|---|---|---|---|---|" + "---|" * len(SAMPLES))
    for name, pairs in groups.items():
        between, sampling = variance_parts([p[0] for p in pairs], samples)
        share = sampling / (between + sampling) if between + sampling else 0.0
        mean_before = sum(p[0] for p in pairs) / len(pairs)
        mean_after = sum(p[1] for p in pairs) / len(pairs)
        cells = " | ".join(f"{bands[at][name][0]:.3f} ({bands[at][name][1]:.3f})" for at in SAMPLES)
        print(f"| {name} | {len(pairs)} | {mean_before:.3f} | {mean_after:.3f} | {share:.0%} | {cells} |")
    timing = ws.root / "metrics" / "timing"
    if (timing / "evaluate.json").exists():
        seconds = {p.stem: json.loads(p.read_text()).get("seconds", 0.0) for p in timing.glob("*.json")}
        stages = [name for name in seconds if name not in ("benchmark", "warmstart")]
        share = seconds["evaluate"] / sum(seconds[name] for name in stages)
        print(f"\nevaluate took {seconds['evaluate']:.1f} s, {share:.1%} of the iteration's stages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
