"""Verification throughput per environment, on the reference solutions of generated tasks.

For each built-in environment (or those named with --envs): generate N training tasks, start the
environment's verifier as the loop does (its own sandbox pool, with its limits and preloaded modules,
one worker per core, for environments that run code), verify a warm-up batch, then time the
verification of every task's reference solution. Every reference must pass (a sanity figure).

Baseline, for environments that run code: the naive sandbox, one fresh interpreter per verification,
timed here as `python -c "import <the modules the environment preloads>"` in a subprocess (a lower
bound: it runs no program at all). The ratio is verifications/s over naive spawns/s.

Beside it, on the environment's benchmark tasks (N per slice, generated as the benchmark stage does):
``reference`` is the mean reward of the tasks' references (1.0 when every one earns full reward) and
``null_baseline`` the mean reward of the null answers of closedloop/envs/null_answers.py (empty,
``pass``, the input returned unchanged, ``{}``, a constant decision...), with ``null_max`` the
highest any one earned: doing nothing must earn nothing (tests/unit/test_null_answers.py holds each
to at most 0.1).

    python benchmarks/verify.py                  # ~1-2 min on 2 cores
    python benchmarks/verify.py --n 100 --envs code,rules
    python benchmarks/verify.py --json figures.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASELINE_SPAWNS = 16


def naive_spawns_per_s(modules: tuple[str, ...], workers: int) -> float:
    """Fresh interpreters per second, each importing ``modules``, ``workers`` at a time."""
    code = "import " + ", ".join(("json",) + modules)

    def spawn(_: int) -> None:
        subprocess.run([sys.executable, "-c", code], check=True)

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(spawn, range(BASELINE_SPAWNS)))
    return BASELINE_SPAWNS / (time.perf_counter() - started)


def null_baseline(verifiers, name: str, n: int, params) -> dict:
    """The references' and the null answers' mean reward over ``n`` benchmark tasks per slice."""
    from closedloop.envs import reward_weights
    from closedloop.envs.base import SLICES
    from closedloop.envs.null_answers import null_answers
    from closedloop.rewards.combine import combine

    env = verifiers.env(name)
    weights = reward_weights(env, params)
    tasks = [t for s in SLICES for t in env.generate(n, seed=params.project.seed, split="benchmark", slice=s)]
    nulls = [(t, text) for t in tasks for text in null_answers(name, t)]
    rewards = [combine(v.components, weights) for v in verifiers.verify_batch(
        name, tasks + [t for t, _ in nulls], [env.reference(t) for t in tasks] + [text for _, text in nulls])]
    references, null = rewards[:len(tasks)], rewards[len(tasks):]
    return {"benchmark_tasks": len(tasks), "reference": round(sum(references) / len(references), 4),
            "null_answers": len(null), "null_baseline": round(sum(null) / len(null), 4), "null_max": round(max(null), 4)}


def measure(name: str, n: int, params) -> dict:
    import os

    from closedloop.rewards.pools import EnvPools

    with EnvPools(params) as verifiers:
        env = verifiers.env(name)
        tasks = env.generate(n, seed=params.project.seed, split="train")
        started = time.perf_counter()
        verifiers.verify_batch(name, tasks[:8], [t.reference for t in tasks[:8]])  # starts the pool
        startup_s = time.perf_counter() - started
        started = time.perf_counter()
        verdicts = verifiers.verify_batch(name, tasks, [env.reference(t) for t in tasks])
        elapsed = time.perf_counter() - started
        isolation = verifiers.isolation().get(name, "none (no code runs)")
        baseline = null_baseline(verifiers, name, n, params)
    figures = {"env": name, "tasks": len(tasks), "passed": sum(v.passed for v in verdicts),
               "seconds": round(elapsed, 3), "verifications_per_s": round(len(tasks) / elapsed, 1),
               "startup_s": round(startup_s, 2), "isolation": isolation, **baseline}
    if env.uses_sandbox:
        workers = params.reward.workers or os.cpu_count() or 1
        baseline = naive_spawns_per_s(tuple(getattr(env, "sandbox_preload", ())), workers)
        figures["baseline_per_s"] = round(baseline, 1)
        figures["ratio"] = round(figures["verifications_per_s"] / baseline, 1)
    return figures


def main() -> int:
    from closedloop.config import BUILTIN_ENVS, Params

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="tasks per environment (default: 300)")
    parser.add_argument("--envs", default=",".join(BUILTIN_ENVS), help="comma-separated environment names")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    params = Params()
    rows = [measure(name, args.n, params) for name in args.envs.split(",")]
    print(f"{'env':8} {'tasks':>6} {'passed':>7} {'verif/s':>9} {'naive/s':>8} {'ratio':>6} "
          f"{'reference':>9} {'null':>6} {'null_max':>8}  isolation")
    for row in rows:
        print(f"{row['env']:8} {row['tasks']:>6} {row['passed']:>7} {row['verifications_per_s']:>9} "
              f"{row.get('baseline_per_s', '-'):>8} {row.get('ratio', '-'):>6} {row['reference']:>9.3f} "
              f"{row['null_baseline']:>6.3f} {row['null_max']:>8.3f}  {row['isolation']}")
    print("baseline: one fresh `python -c 'import <preloaded modules>'` per verification (naive sandbox, lower bound)")
    print(f"reference / null / null_max: mean reward of the references, mean and highest reward of the null "
          f"answers, over {rows[0]['benchmark_tasks'] if rows else 0} benchmark tasks per environment")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    failed = [row["env"] for row in rows if row["passed"] != row["tasks"] or row["reference"] != 1.0]
    if failed:
        print(f"reference solutions failed in: {failed}", file=sys.stderr)
        return 1
    rewarded = [row["env"] for row in rows if row["null_max"] > 0.1]
    if rewarded:
        print(f"a null answer earned more than 0.1 in: {rewarded}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
