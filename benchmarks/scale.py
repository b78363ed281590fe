"""Scale out: the execution seam's throughput with 1 and 2 Ray workers, against the local backend.

One local Ray is started in this process (``ray.init(num_cpus=<the machine's cores>)``); the
RayExecutor reuses it. Every figure runs the stages' own workers through the seam
(closedloop/execution): ``VerifierWorker`` for the reward stage's sandboxed verifications,
``SampleWorker`` for the sample stage's HF sampler. Baseline of every row: the local backend (one
worker in this process, ``execution.backend: local``), on the same shards.

- reward: the code, data and script environments' benchmark tasks (every slice), each verified with
  its reference solution, another task's reference (wrong, but it runs) and the null answers of
  closedloop/envs/null_answers.py (wrong, mostly fail fast); cut per environment into
  ``execution.shards`` shards as ShardedVerifiers cuts them. Timed warm: the best of ``--repeats``
  passes of the same shards on the same pool (the first, cold pass starts the sandbox pools and is
  reported as a one-off).
- sample: a random built-in policy at params.yaml's default size (192 hidden, 4 layers, float32 on
  the CPU), benchmark prompts, params.yaml's sample settings (k 8, max_new_tokens 96, temperature
  1.0); shards cut on the sampler's unit (32 prompts: one batch of 256 sequences). Each Ray worker
  holds its own HF sampler on the same model directory. Timed after one warm-up shard per worker:
  the best of ``--repeats`` passes (other sessions share the cores).
- overhead: the round trip of a trivial shard (an empty ``rules`` shard: nothing to verify) through
  a RayPool vs the LocalPool, one at a time (median) and 64 at once (per shard); an
  ``executor.call`` (the train stage's path: a Ray task) vs a local call; and the one-off costs:
  Ray start, pool start (actors built, each running the worker's setup: a model load, EnvPools).

Scaling efficiency = throughput with 2 workers / (2 x throughput with 1 worker).

    python benchmarks/scale.py              # ~4.5 min on 2 cores (longer under load)
    python benchmarks/scale.py --quick      # ~2 min: fewer tasks, prompts and round trips
    python benchmarks/scale.py --json figures.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SANDBOX_ENVS = ("code", "data", "script")
EMPTY_SHARD = {"env": "rules", "tasks": [], "completions": []}


def configs(shards: int) -> dict:
    """params for the three settings compared, all on the same number of shards."""
    from closedloop.config import parse_params

    def of(backend: str, workers: int = 1):
        return parse_params({"execution": {"backend": backend, "shards": shards, "ray": {"workers": workers}}})

    return {"local": of("local"), "ray x1": of("ray", 1), "ray x2": of("ray", 2)}


# --- reward ---------------------------------------------------------------------------------------

def verification_mix(params, per_slice: int) -> list[tuple[str, dict, str]]:
    """(env, task record, completion): references, a wrong reference and the null answers."""
    from closedloop.envs import get_env
    from closedloop.envs.base import SLICES
    from closedloop.envs.null_answers import null_answers

    mix = []
    for name in SANDBOX_ENVS:
        env = get_env(name, params)
        tasks = [t for s in SLICES for t in env.generate(per_slice, seed=params.project.seed, split="benchmark", slice=s)]
        for i, task in enumerate(tasks):
            wrong = env.reference(tasks[(i + 1) % len(tasks)])
            for completion in [env.reference(task), wrong, *null_answers(name, task)]:
                mix.append((name, task.to_record(), completion))
    return mix


def verification_shards(mix, shards: int) -> list[dict]:
    """Per environment, ``shards`` contiguous pieces: the cut ShardedVerifiers.prefetch makes."""
    from closedloop.execution.base import split

    out = []
    for name in SANDBOX_ENVS:
        items = [(record, completion) for env, record, completion in mix if env == name]
        for r in split(len(items), shards):
            out.append({"env": name, "tasks": [rec for rec, _ in items[r.start:r.stop]],
                        "completions": [c for _, c in items[r.start:r.stop]]})
    return out


def verifier_setup(params, executor):
    from closedloop.execution.factory import shard_resources

    resources = shard_resources(params, gpus=False)
    # As ShardedVerifiers: reward.workers, else (0) the cores one worker was given.
    return {"params": params.model_dump(mode="json"),
            "sandbox_workers": params.reward.workers or executor.worker_cpus(resources)}, resources


def measure_reward(params, shards: list[dict], repeats: int) -> dict:
    from closedloop.execution.factory import open_executor
    from closedloop.rewards.verification import VERIFIER_WORKER

    count = sum(len(s["completions"]) for s in shards)
    with open_executor(params) as executor:
        setup, resources = verifier_setup(params, executor)
        t = time.perf_counter()
        pool = executor.pool(VERIFIER_WORKER, setup, resources)
        pool_s = time.perf_counter() - t
        try:
            t = time.perf_counter()
            pool.map(shards)  # cold: starts each worker's sandbox pools
            cold_s = time.perf_counter() - t
            walls = []
            for _ in range(repeats):  # the best pass: other sessions share these cores
                t = time.perf_counter()
                results = pool.map(shards)
                walls.append(time.perf_counter() - t)
            warm_s = min(walls)
        finally:
            t = time.perf_counter()
            pool.close()
            close_s = time.perf_counter() - t
    passed = sum(v["passed"] for r in results for v in r["verdicts"])
    return {"verifications": count, "passed": passed, "shards": len(shards), "pool_start_s": pool_s,
            "cold_s": cold_s, "warm_s": warm_s, "walls": walls, "per_s": count / warm_s, "close_s": close_s,
            # None: reward.workers, whose 0 is one sandbox process per core of this machine
            "sandbox_workers": setup["sandbox_workers"] or params.reward.workers or os.cpu_count(),
            "worker_s": sum(r["seconds"] for r in results)}


# --- sample ---------------------------------------------------------------------------------------

def measure_sample(params, model_dir: Path, prompts: list[str], workers: int, repeats: int) -> dict:
    from closedloop.execution.factory import open_executor, shard_resources
    from closedloop.sampling.base import backend_class
    from closedloop.sampling.shards import SAMPLE_WORKER, sample_shards

    s = params.sample
    unit = backend_class(params).shard_unit(s, s.k, s.batch_size)
    names = [f"p{i}" for i in range(len(prompts))]
    shards = sample_shards(prompts, names, shards=params.execution.shards, unit=unit, seed=0, k=s.k,
                           batch_size=s.batch_size)
    # One full shard per worker (ActorPool hands the first ones to idle actors): the first batch of
    # 256 sequences allocates the decoder's cache and costs ~1.7x a later one.
    warm = [dict(shards[0], seed=1)] * workers
    setup = {"params": params.model_dump(mode="json"), "model_dir": str(model_dir)}
    with open_executor(params) as executor:
        t = time.perf_counter()
        pool = executor.pool(SAMPLE_WORKER, setup, shard_resources(params))
        pool_s = time.perf_counter() - t
        try:
            t = time.perf_counter()
            pool.map(warm)
            warmup_s = time.perf_counter() - t
            walls = []
            for _ in range(repeats):  # the best pass: other sessions share these cores
                t = time.perf_counter()
                results = pool.map(shards)
                walls.append(time.perf_counter() - t)
            wall = min(walls)
        finally:
            pool.close()
    rows = [row for r in results for row in r["completions"]]
    tokens = sum(c["completion_tokens"] for row in rows for c in row)
    return {"prompts": len(prompts), "sequences": sum(len(row) for row in rows), "tokens": tokens,
            "shards": len(shards), "pool_start_s": pool_s, "warmup_s": warmup_s, "wall_s": wall,
            "per_s": tokens / wall, "walls": walls, "worker_s": sum(r["wall_s"] for r in results),
            "texts": [c["text"] for row in rows for c in row]}


def benchmark_prompts(params, n: int) -> list[str]:
    from closedloop.envs import get_env

    names = params.envs.active()
    per_env = -(-n // len(names))
    prompts = [t.prompt for name in names
               for t in get_env(name, params).generate(per_env, seed=1, split="benchmark", slice="core")]
    return prompts[:n]


def random_builtin(params, out: Path) -> Path:
    from closedloop.models.builtin import create_builtin
    from closedloop.stages.warmstart import mixed_tasks

    corpus = [t.prompt + t.reference for t in mixed_tasks(params, params.warmstart.tokenizer_corpus_tasks, "tokenizer")]
    create_builtin(params.model.builtin, corpus, out, seed=0)
    return out


# --- overhead -------------------------------------------------------------------------------------

def measure_overhead(params, trips: int) -> dict:
    from closedloop.execution.factory import open_executor
    from closedloop.rewards.verification import VERIFIER_WORKER

    with open_executor(params) as executor:
        setup, resources = verifier_setup(params, executor)
        t = time.perf_counter()
        pool = executor.pool(VERIFIER_WORKER, setup, resources)
        pool_s = time.perf_counter() - t
        try:
            pool.map([EMPTY_SHARD])
            single = []
            for _ in range(trips):
                t = time.perf_counter()
                pool.map([EMPTY_SHARD])
                single.append(time.perf_counter() - t)
            t = time.perf_counter()
            pool.map([EMPTY_SHARD] * 64)
            batch_s = (time.perf_counter() - t) / 64
        finally:
            pool.close()
        executor.call("json:dumps", {"warm": True})
        calls = []
        for _ in range(max(5, trips // 10)):
            t = time.perf_counter()
            executor.call("json:dumps", {"x": 1})
            calls.append(time.perf_counter() - t)
    return {"pool_start_s": pool_s, "shard_ms": statistics.median(single) * 1e3,
            "shard_p90_ms": sorted(single)[int(0.9 * len(single))] * 1e3, "shard_batched_ms": batch_s * 1e3,
            "call_ms": statistics.median(calls) * 1e3}


def actor_threads() -> tuple[int, str]:
    """torch's intra-op threads in a Ray task asking for 1 CPU (what a sampling actor gets)."""
    import ray

    @ray.remote(num_cpus=1)
    def probe():
        import torch

        return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS", "unset")

    return ray.get(probe.remote())


# --- report ---------------------------------------------------------------------------------------

def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (~2 min)")
    parser.add_argument("--shards", type=int, default=4, help="execution.shards for every row (>= 2)")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per row; the best is kept")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    per_slice, n_prompts, trips = (4, 64, 50) if args.quick else (10, 128, 200)
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]

    import ray

    t = time.perf_counter()
    ray.init(num_cpus=cores, include_dashboard=False, logging_level="warning", log_to_driver=False)
    ray_start_s = time.perf_counter() - t
    try:
        params = configs(args.shards)
        figures: dict = {"cores": cores, "load_before": load, "ray_start_s": ray_start_s, "shards": args.shards}
        threads = actor_threads()
        figures["actor_torch_threads"] = threads[0]

        print(f"{cores} cores, load average {load:.2f} before the run; ray.init {ray_start_s:.2f} s; "
              f"execution.shards {args.shards}; torch threads in a 1-CPU Ray worker: {threads[0]} "
              f"(OMP_NUM_THREADS={threads[1]})\n", flush=True)

        overhead = {name: measure_overhead(p, trips) for name, p in params.items()}
        figures["overhead"] = overhead

        mix = verification_mix(params["local"], per_slice)
        vshards = verification_shards(mix, args.shards)
        reward = {}
        for name, p in params.items():
            reward[name] = measure_reward(p, vshards, args.repeats)
            print(f"reward {name}: {reward[name]['per_s']:.1f} verifications/s (passes "
                  f"{', '.join(f'{w:.2f}' for w in reward[name]['walls'])} s)", flush=True)
        figures["reward"] = reward

        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            model_dir = random_builtin(params["local"], Path(tmp) / "model")
            build_s = time.perf_counter() - t
            prompts = benchmark_prompts(params["local"], n_prompts)
            sample = {}
            for name, p in params.items():
                sample[name] = measure_sample(p, model_dir, prompts, p.execution.ray.workers, args.repeats)
                print(f"sample {name}: {sample[name]['per_s']:.0f} tokens/s (passes "
                      f"{', '.join(f'{w:.2f}' for w in sample[name]['walls'])} s)", flush=True)
        texts = {name: row.pop("texts") for name, row in sample.items()}
        figures["sample"] = sample
        figures["sample_identical"] = {name: texts[name] == texts["local"] for name in texts}
    finally:
        ray.shutdown()  # this process's Ray only (never `ray stop`)

    print()
    r, s, o = reward, sample, overhead
    vr = r["local"]
    print(f"reward: {vr['verifications']} verifications ({', '.join(SANDBOX_ENVS)} benchmark tasks: reference, "
          f"a wrong reference, null answers; {vr['passed']} pass) in {vr['shards']} shards; warm pass timed")
    print(f"{'backend':<9} {'sandbox/worker':>14} {'pool start s':>12} {'cold pass s':>11} {'warm s':>7} "
          f"{'verif/s':>8} {'vs local':>8} {'passed':>7}")
    for name, row in r.items():
        print(f"{name:<9} {row['sandbox_workers']:>14} {row['pool_start_s']:>12.2f} {row['cold_s']:>11.2f} "
              f"{row['warm_s']:>7.2f} {row['per_s']:>8.1f} {ratio(row['per_s'], vr['per_s']):>8} {row['passed']:>7}")
    print(f"scaling efficiency (ray x2 / 2 x ray x1): {r['ray x2']['per_s'] / (2 * r['ray x1']['per_s']):.2f}\n")

    sl = s["local"]
    print(f"sample: random built-in at the default size, {sl['prompts']} benchmark prompts x k={params['local'].sample.k} "
          f"= {sl['sequences']} sequences in {sl['shards']} shards (model built in {build_s:.1f} s)")
    print(f"{'backend':<9} {'pool start s':>12} {'warm-up s':>9} {'tokens':>8} {'wall s':>7} {'tokens/s':>9} "
          f"{'vs local':>8} {'same samples':>12}")
    for name, row in s.items():
        print(f"{name:<9} {row['pool_start_s']:>12.2f} {row['warmup_s']:>9.2f} {row['tokens']:>8} {row['wall_s']:>7.2f} "
              f"{row['per_s']:>9.0f} {ratio(row['per_s'], sl['per_s']):>8} "
              f"{'yes' if figures['sample_identical'][name] else 'no':>12}")
    print(f"scaling efficiency (ray x2 / 2 x ray x1): {s['ray x2']['per_s'] / (2 * s['ray x1']['per_s']):.2f}\n")

    ol = o["local"]
    print(f"overhead: a trivial shard (empty rules shard), {trips} round trips one at a time, then 64 at once")
    print(f"{'backend':<9} {'pool start s':>12} {'shard ms':>9} {'p90 ms':>7} {'vs local':>9} {'64 at once ms/shard':>19} "
          f"{'call ms':>8} {'vs local':>9}")
    for name, row in o.items():
        print(f"{name:<9} {row['pool_start_s']:>12.3f} {row['shard_ms']:>9.3f} {row['shard_p90_ms']:>7.3f} "
              f"{ratio(row['shard_ms'], ol['shard_ms']):>9} {row['shard_batched_ms']:>19.3f} {row['call_ms']:>8.3f} "
              f"{ratio(row['call_ms'], ol['call_ms']):>9}")
    print(f"one-off: ray.init {ray_start_s:.2f} s; verifier pool start (EnvPools) ray x1 "
          f"{r['ray x1']['pool_start_s']:.2f} s vs local {vr['pool_start_s']:.3f} s; sandbox pools (cold pass - warm pass) "
          f"ray x1 {r['ray x1']['cold_s'] - r['ray x1']['warm_s']:.2f} s vs local {vr['cold_s'] - vr['warm_s']:.2f} s; "
          f"sampler pool start (model load) ray x1 {s['ray x1']['pool_start_s']:.2f} s, ray x2 "
          f"{s['ray x2']['pool_start_s']:.2f} s vs local {sl['pool_start_s']:.2f} s")
    print("baseline of every ratio: the local backend (one worker in this process) on the same shards")
    figures["load_after"] = os.getloadavg()
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in figures['load_after'])}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
