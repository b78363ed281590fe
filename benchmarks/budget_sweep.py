"""Which training budget buys the most gain per minute? Several settings of the warm start and the
train stage, each run as its own closed loop (warm start + N iterations), side by side.

A sweep of budgets needs many whole loops, more than a 2-core machine runs in a session, so this
harness runs the loop's stages in-process (``run_stage``: the same stage code `dvc repro` and the
Prefect tasks run) without the orchestration around them: no Prefect, DVC, MLflow or GX. That is what
lets it run on a machine that has only torch and transformers (a GPU machine with many cores); what it
leaves out, and why the figures still compare:

- GX validation is not run; the batch is taken as valid (the real loop's validation only refuses
  malformed batches, and these come from the same stage code).
- replay of earlier iterations' positives (``train.replay``) reads DVC experiments: set to 0 here for
  every setting alike.
- The gate, monitors and promote stages run as in the loop: a held candidate is not promoted.

Baseline: the first setting (``default``, today's params). Every setting shares the seed, tasks and
benchmark; the gain is each setting's champion against its own warm start. Run it with the machine to
itself: each setting gets ``--threads`` torch threads and the settings run ``--parallel`` at a time.

    python benchmarks/budget_sweep.py --iterations 2 --out /tmp/sweep.jsonl
    python benchmarks/budget_sweep.py --settings default,short --iterations 5 --parallel 2 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402  (after the path: the project's modules below)

from closedloop.io import read_json, replace_dir, write_json  # noqa: E402
from closedloop.stages.common import run_stage  # noqa: E402
from closedloop.versioning.loop import ensure_labels  # noqa: E402
from closedloop.workspace import Workspace  # noqa: E402

# Every environment but rules left out of the loop (share 0).
RULES_ALONE = {name: {"share": 0.0} for name in ("code", "data", "script", "extract")}
# Each setting: overrides of the repo's params.yaml. "default" is today's params, the baseline.
SETTINGS: dict[str, dict] = {
    "default": {},
    # a warm start that stops at half the steps, at a higher rate; an iteration's train stage of 150 steps
    "ws400_t150_lr2": {"warmstart": {"steps": 400, "lr": 0.003}, "train": {"steps": 150, "lr": 0.002}},
    "ws400_t100_ref25": {"warmstart": {"steps": 400, "lr": 0.003},
                         "train": {"steps": 100, "lr": 0.002, "reference_fraction": 0.25}},
    "ws300_t150_lr2": {"warmstart": {"steps": 300, "lr": 0.003}, "train": {"steps": 150, "lr": 0.002}},
    "ws500_t150_lr2": {"warmstart": {"steps": 500, "lr": 0.003}, "train": {"steps": 150, "lr": 0.002}},
    "ws400_t60_lr2": {"warmstart": {"steps": 400, "lr": 0.003}, "train": {"steps": 60, "lr": 0.002}},
    "ws400_epochs2": {"warmstart": {"steps": 400, "lr": 0.003},
                      "train": {"steps": None, "epochs": 2.0, "lr": 0.002, "reference_fraction": 0.5}},
    "ws400lr4_t150_lr2": {"warmstart": {"steps": 400, "lr": 0.004}, "train": {"steps": 150, "lr": 0.002}},
    # the control: the same budget on the references alone (what training without the loop's data gives)
    "ws400_t150_lr2_sft": {"warmstart": {"steps": 400, "lr": 0.003},
                           "train": {"mode": "sft", "steps": 150, "lr": 0.002}},
    "ws300_t150_lr2_sft": {"warmstart": {"steps": 300, "lr": 0.003},
                           "train": {"mode": "sft", "steps": 150, "lr": 0.002}},
    "default_sft": {"train": {"mode": "sft"}},
    # today's params, trained in bfloat16 autocast (train.mixed_precision): its speed and pass@1 beside default
    "default_bf16": {"train": {"mixed_precision": "bf16"}},
    "ws300_t200_lr2": {"warmstart": {"steps": 300, "lr": 0.003}, "train": {"steps": 200, "lr": 0.002}},
    "ws300_t150_lr3": {"warmstart": {"steps": 300, "lr": 0.003}, "train": {"steps": 150, "lr": 0.003}},
    "ws400lr4_t200_lr2": {"warmstart": {"steps": 400, "lr": 0.004}, "train": {"steps": 200, "lr": 0.002}},
    # half the batch and half the benchmark samples: a shorter iteration outside training
    "ws300_t150_lr2_n400_e2": {"warmstart": {"steps": 300, "lr": 0.003}, "train": {"steps": 150, "lr": 0.002},
                               "generate": {"n_tasks": 400}, "evaluate": {"samples_per_task": 2}},
    # a smaller built-in (hidden 128, MLP 384: 0.58x the CPU time of a training step), and the default
    # warm start with half the train steps; each beside its control
    "s128": {"model": {"builtin": {"hidden_size": 128, "intermediate_size": 384}}},
    "s128_sft": {"model": {"builtin": {"hidden_size": 128, "intermediate_size": 384}}, "train": {"mode": "sft"}},
    "t200": {"train": {"steps": 200}},
    "t200_sft": {"train": {"steps": 200, "mode": "sft"}},
    "s128_t200_n400_e2": {"model": {"builtin": {"hidden_size": 128, "intermediate_size": 384}},
                          "train": {"steps": 200}, "generate": {"n_tasks": 400}, "evaluate": {"samples_per_task": 2}},
    "s128_t200_n400_e2_sft": {"model": {"builtin": {"hidden_size": 128, "intermediate_size": 384}},
                              "train": {"steps": 200, "mode": "sft"}, "generate": {"n_tasks": 400},
                              "evaluate": {"samples_per_task": 2}},
    "s128_ws500lr3_t200": {"model": {"builtin": {"hidden_size": 128, "intermediate_size": 384}},
                           "warmstart": {"steps": 500, "lr": 0.003}, "train": {"steps": 200}},
    "s128_ws500lr3_t200_sft": {"model": {"builtin": {"hidden_size": 128, "intermediate_size": 384}},
                               "warmstart": {"steps": 500, "lr": 0.003}, "train": {"steps": 200, "mode": "sft"}},
    # the default's warm start and train stage with half the batch (and half the benchmark samples)
    "n400": {"generate": {"n_tasks": 400}},
    "n400_e2": {"generate": {"n_tasks": 400}, "evaluate": {"samples_per_task": 2}},
    # issue 25's rules probe: is the built-in's width what keeps rules at chance? The warm start on rules
    # alone (every reference and warm-start step is a rules task), at today's width and at twice it (the
    # same 48-wide heads, twice as many)
    "rules_only": {"envs": RULES_ALONE},
    "rules_only_w384": {"envs": RULES_ALONE,
                        "model": {"builtin": {"hidden_size": 384, "num_heads": 8, "intermediate_size": 1152}}},
}
# For every setting alike: what the harness cannot do without DVC (see the docstring).
COMMON = {"train": {"replay": {"last": 0, "versions": []}}, "monitors": {"versions": []}}
ITERATION_STAGES = ("generate", "sample", "reward", "grade", "train", "evaluate", "monitors", "gate", "promote")


def merged(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def params_for(setting: dict, extra: dict) -> dict:
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    return merged(merged(merged(base, COMMON), setting), extra)


def run_loop(name: str, params: dict, iterations: int, workdir: Path, out: Path, final_samples: int = 0) -> None:
    """Warm start + ``iterations`` iterations of one setting in ``workdir/name``; one JSON line per
    iteration appended to ``out``."""
    root = workdir / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ws = Workspace.at(root)

    def write(iteration: int) -> None:
        (root / "params.yaml").write_text(yaml.safe_dump(merged(params, {"loop": {"iteration": iteration}}),
                                                         sort_keys=False))

    def emit(row: dict) -> None:
        with out.open("a") as handle:
            handle.write(json.dumps({"setting": name, **row}) + "\n")
        print(json.dumps({"setting": name, **row}), flush=True)

    write(0)
    started = time.perf_counter()
    seconds = {stage: run_stage(stage, root)["seconds"] for stage in ("benchmark", "warmstart")}
    warm = read_json(ws.warmstart_eval)
    emit({"iteration": 0, "pass@1": warm["summary"]["overall"]["pass@1"],
          "envs": {env: f["pass@1"] for env, f in warm["summary"]["envs"].items()}, "seconds": seconds,
          "wall_s": round(time.perf_counter() - started, 1)})
    for iteration in range(1, iterations + 1):
        write(iteration)
        started = time.perf_counter()
        source = ws.next_champion if ws.next_champion.exists() else ws.warmstart_model
        replace_dir(source, ws.champion)
        ensure_labels(ws)  # as close_loop does (the labels, known hacks and review outcome, empty)
        seconds = {}
        for stage in ITERATION_STAGES:
            if stage == "train":  # GX is not run here (see the docstring): the batch counts as valid
                write_json(ws.validation_report, {"success": True, "skipped": "budget_sweep runs no GX"})
            seconds[stage] = run_stage(stage, root)["seconds"]
        gate = read_json(ws.gate)
        train = read_json(ws.metrics("train"))
        emit({"iteration": iteration, "champion": gate["champion"]["overall"]["pass@1"],
              "candidate": gate["candidate"]["overall"]["pass@1"], "promoted": bool(gate["promote"]),
              "envs": {env: f["pass@1"] for env, f in gate["candidate"]["envs"].items()},
              "train_steps": train["steps"], "train_tokens": train["tokens"], "seconds": seconds,
              "wall_s": round(time.perf_counter() - started, 1)})
    if final_samples and iterations:
        emit({"final_check": final_check(ws, final_samples)})


def final_check(ws, samples: int) -> dict:
    """The warm start and the final champion on the benchmark, ``samples`` per task, same seed: the
    paired change over tasks ± its standard error (as benchmarks/learning.py computes it)."""
    from learning import paired_difference, pass_rates

    from closedloop.config import load_params
    from closedloop.envs.base import load_tasks
    from closedloop.evaluation.runner import evaluate_policy
    from closedloop.rewards.pools import EnvPools

    params = load_params(ws.root)
    tasks = load_tasks(ws.benchmark_tasks)
    final = ws.next_champion if ws.next_champion.exists() else ws.warmstart_model
    with EnvPools(params) as verifiers:
        warm, last = (evaluate_policy(model, tasks, params=params, samples_per_task=samples,
                                      seed=params.stage_seed("final_check", False),
                                      batch_size=params.evaluate.batch_size, verifiers=verifiers)
                      for model in (ws.warmstart_model, final))
    return {"samples_per_task": samples, "warm_start": pass_rates(warm["summary"]),
            "final": pass_rates(last["summary"]),
            "change": paired_difference(warm["per_task"], last["per_task"], samples, tasks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names of SETTINGS")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=1, help="settings run at once")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per setting")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/budget_sweep"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/budget_sweep.jsonl"))
    parser.add_argument("--extra", default="{}", help="JSON overrides for every setting (e.g. tests' tiny params)")
    parser.add_argument("--final-samples", type=int, default=0,
                        help="then the warm start and the final champion at this many samples per task, paired")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: run this setting
    args = parser.parse_args()
    extra = json.loads(args.extra)
    if args.one:
        import torch

        torch.set_num_threads(args.threads)
        run_loop(args.one, params_for(SETTINGS[args.one], extra), args.iterations, args.workdir, args.out,
                 args.final_samples)
        return 0
    names = [name for name in args.settings.split(",") if name]
    unknown = [name for name in names if name not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {sorted(SETTINGS)}")
    args.out.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    pending, running, failed = list(names), {}, []
    while pending or running:
        while pending and len(running) < args.parallel:
            name = pending.pop(0)
            log = (args.workdir / f"{name}.log")
            log.parent.mkdir(parents=True, exist_ok=True)
            running[name] = subprocess.Popen(
                [sys.executable, __file__, "--one", name, "--iterations", str(args.iterations), "--threads",
                 str(args.threads), "--workdir", str(args.workdir), "--out", str(args.out), "--extra", args.extra,
                 "--final-samples", str(args.final_samples)],
                env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        time.sleep(2)
        for name, process in list(running.items()):
            if process.poll() is not None:
                del running[name]
                if process.returncode:
                    failed.append(name)
                    print(f"{name}: failed (exit {process.returncode}); see {args.workdir / name}.log", flush=True)
    print_table(args.out)
    return 1 if failed else 0


def print_table(out: Path) -> None:
    if not out.exists():
        return
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    finals = {row["setting"]: row["final_check"] for row in rows if "final_check" in row}
    by_setting: dict[str, list[dict]] = {}
    for row in rows:
        if "final_check" in row:
            continue
        by_setting.setdefault(row["setting"], []).append(row)
    print("\n| setting | warm start pass@1 | warm start s | champion after each iteration | gain pp | s per iteration |")
    print("|---|---|---|---|---|---|")
    for name, its in by_setting.items():
        its.sort(key=lambda r: r["iteration"])
        warm = its[0]
        champions = [r["candidate"] if r["promoted"] else r["champion"] for r in its[1:]]
        per_it = [r["wall_s"] for r in its[1:]]
        gain = (champions[-1] - warm["pass@1"]) * 100 if champions else 0.0
        print(f"| {name} | {warm['pass@1']:.3f} | {warm['wall_s']:.0f} | "
              f"{' → '.join(f'{c:.3f}' for c in champions)} | {gain:+.1f} | "
              f"{(sum(per_it) / len(per_it)) if per_it else 0:.0f} |")
    if finals:
        print("\n| setting | samples per task | warm start | final champion | change (paired, ± SE) |")
        print("|---|---|---|---|---|")
        for name, check in finals.items():
            change = check["change"]["overall"]
            print(f"| {name} | {check['samples_per_task']} | {check['warm_start']['overall']:.3f} | "
                  f"{check['final']['overall']:.3f} | {change['diff'] * 100:+.1f} ± {change['se'] * 100:.1f} pp |")


if __name__ == "__main__":
    sys.exit(main())
