"""What grpo's on-policy rounds did to the policy, round by round and environment by environment, and which
groups its batch trained on (issue 25: why grpo gains nothing).

A grpo train stage with ``train.grpo.rounds: R > 1`` samples each later round from the policy as trained so
far (data/batch/train_rounds.jsonl). If the updates help, those rounds' pass rates rise; if they fall round
after round, the updates hurt the very tasks they train on. The batch's groups say what the gradient is made
of: a group where some samples passed and some failed carries the verdict; a group where every sample
failed still has a reward spread when partial credit differs, and scaled advantages give it the same
weight as a verdict.

    python benchmarks/learning.py --modes grpo --iterations 1 --final-samples 0 --from-warmstart WS \\
        --workdir /tmp/lr25/d2 --set train.grpo.rounds=8 --set train.shaping.base=passed ...
    python benchmarks/grpo_rounds.py /tmp/lr25/d2/grpo /tmp/lr25/d1/grpo

Each argument is a workspace whose last train stage ran grpo with rounds (the workspace of one mode under
learning.py's --workdir).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from closedloop.io import read_jsonl  # noqa: E402
from closedloop.training.grpo import ZERO_SPREAD  # noqa: E402  (below it a group carries no advantage)
KINDS = ("mixed", "all_fail_spread", "all_fail_flat", "all_pass")


def group_kind(rows: list[dict]) -> str:
    """mixed: some samples passed and some failed; all_fail_spread: none passed but the rewards differ
    (partial credit); all_fail_flat: none passed, one reward; all_pass: every sample passed."""
    passed = sum(bool(row["passed"]) for row in rows)
    if 0 < passed < len(rows):
        return "mixed"
    if passed:
        return "all_pass"
    spread = statistics.pstdev([row["reward"] for row in rows]) if len(rows) > 1 else 0.0
    return "all_fail_spread" if spread >= ZERO_SPREAD else "all_fail_flat"


def group_composition(rewards: list[dict]) -> dict[str, dict[str, int]]:
    """{env: {kind: groups}} over rewards.jsonl rows, grouped by task."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rewards:
        groups[row["task_id"]].append(row)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))
    for rows in groups.values():
        counts[rows[0]["env"]][group_kind(rows)] += 1
    return dict(counts)


def round_pass_rates(rounds: list[dict]) -> dict[int, dict[str, tuple[float, int]]]:
    """{round: {env: (pass rate, samples)}} over train_rounds.jsonl rows."""
    tally: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row in rounds:
        cell = tally[row["round"]][row["env"]]
        cell[0] += bool(row["scored"]["passed"])
        cell[1] += 1
    return {number: {env: (passed / total, total) for env, (passed, total) in envs.items()}
            for number, envs in sorted(tally.items())}


def measure(root: Path) -> dict:
    batch = root / "data/batch"
    for name in ("rewards.jsonl", "train_rounds.jsonl"):
        if not (batch / name).is_file():
            raise SystemExit(f"{root}: no data/batch/{name} (a workspace whose train stage ran grpo with rounds)")
    rounds = list(read_jsonl(batch / "train_rounds.jsonl"))
    if not rounds:
        raise SystemExit(f"{root}: data/batch/train_rounds.jsonl is empty (train.grpo.rounds was 1)")
    return {"workspace": str(root), "groups": group_composition(list(read_jsonl(batch / "rewards.jsonl"))),
            "rounds": round_pass_rates(rounds)}


def print_figures(figures: dict) -> None:
    print(f"## {figures['workspace']}")
    envs = sorted(figures["groups"])
    print("| groups (sample stage's batch) | " + " | ".join(envs) + " | all |")
    print("|---" * (len(envs) + 2) + "|")
    for kind in KINDS:
        counts = [figures["groups"][env][kind] for env in envs]
        print(f"| {kind} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
    print()
    print("| round: pass rate of the policy as trained so far | " + " | ".join(envs) + " | all |")
    print("|---" * (len(envs) + 2) + "|")
    for number, by_env in figures["rounds"].items():
        passed = sum(rate * total for rate, total in by_env.values())
        total = sum(total for _, total in by_env.values())
        cells = [f"{by_env[env][0]:.2f}" if env in by_env else "-" for env in envs]
        print(f"| {number} | " + " | ".join(cells) + f" | {passed / total:.3f} |")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspaces", nargs="+", type=Path, help="workspaces whose train stage ran grpo with rounds")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    rows = [measure(root) for root in args.workspaces]
    for row in rows:
        print_figures(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
