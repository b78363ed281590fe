"""Does the closed loop make the built-in policy better? rft and grpo from one warm start.

Runs the warm start once on a fresh workspace with the default params (the built-in policy, as
`make run`), copies it once per training mode, sets `train.mode`, and runs the loop one iteration at
a time through the Prefect flow, printing after each: the champion's benchmark pass@1 overall and per
environment (the champion is the candidate when the gate promoted it), the candidate's, the batch's
positives, fix pairs and replayed examples, GRPO's skipped groups, training tokens/s and wall time.
Baseline: the warm start's pass@1 (the gain is read against it); an `sft` mode (the references
alone, the same `train.epochs` over them) is the control that shows how much of the gain is the loop's data.

    python benchmarks/learning.py                          # rft and grpo, 5 iterations each
    python benchmarks/learning.py --modes grpo,rft,sft --iterations 5 --out docs/learning.json \
        --plot docs/learning_curves.png

The loop's own evaluations use 4 samples per task, so one environment's figure (80 tasks) moves by
about 2.5 pp on sampling alone. At the end, the warm start and each mode's final champion are
evaluated again on the benchmark with ``--final-samples`` samples per task (paired: same seed, same
tasks), and the per-environment difference is printed with its standard error over tasks. With
``--final-rounds R`` every model runs the check as episodes of R rounds (each also after round 1), and
``--final-set SECTION.KEY=YAML`` lays the same overrides over every model's check (an arm trained with
``sample.trim_transcript`` is measured with it, and so are the others). With ``--workdir`` each
model's measurement is kept under WORKDIR/measured and reused for the same weights and settings.

``--compare trl`` then runs TRL's GRPOTrainer (benchmarks/trl_compare.py; ``pip install -e '.[bench]'``)
from the same warm start, on the training tasks the best mode's iterations drew, with the loop's
feedback sources as its reward, for the best mode's wall-clock, and prints both curves (pass@1 against
minutes) in one table; its final policy joins the paired final check, and ``--plot`` also writes the
curves against minutes (``*_minutes.png``).

    python benchmarks/learning.py --modes rft,grpo --iterations 5 --compare trl --out docs/trl.json \
        --plot docs/trl_curves.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def champion_after(gate: dict) -> dict:
    """The benchmark summary of the champion once the iteration is done."""
    return gate["candidate"] if gate["promote"] else gate["champion"]


def pass_rates(summary: dict) -> dict:
    return {"overall": summary["overall"]["pass@1"],
            **{env: figures["pass@1"] for env, figures in sorted(summary.get("envs", {}).items())}}


def iteration_row(ws, mode: str, iteration: int, wall_s: float) -> dict:
    from closedloop.io import read_json

    gate = read_json(ws.gate)
    train = read_json(ws.metrics("train"))
    grade = read_json(ws.metrics("grade"))
    timing = read_json(ws.root / "metrics/timing/train.json")  # seconds and throughput live apart
    examples = train.get("examples", {})
    return {
        "mode": mode, "iteration": iteration, "wall_s": round(wall_s, 1), "promoted": bool(gate["promote"]),
        "champion": pass_rates(champion_after(gate)), "candidate": pass_rates(gate["candidate"]),
        "positives": grade["buckets"]["positive"], "tasks_solved": grade["tasks_solved"],
        "fix_pairs": grade["fix_pairs"], "trained_on": examples, "replay": train.get("replay", {}),
        "skipped_groups": train.get("skipped_groups"), "groups": train.get("groups"),
        "train_steps": train["steps"], "train_tokens": train["tokens"], "train_tokens_per_s": timing["tokens_per_s"],
        "train_seconds": timing["seconds"],
        # The groups the gate would have held for at the first evaluation, measured again (gate.confirm_samples).
        "measured_again": sorted((gate.get("confirmation") or {}).get("groups", {})),
        # grpo: the trainer's figures (on-policy rounds: each round's own pass rate as the policy trained)
        **({key: train.get(key) for key in ("rounds", "round_pass_rates", "kl_last", "clip_low", "clip_high",
                                            "entropy_first", "entropy_last", "frac_reward_zero_std")}
           if mode.split("+")[0] == "grpo" else {}),
    }


def describe(row: dict, warm: dict) -> str:
    gain = (row["champion"]["overall"] - warm["overall"]) * 100
    envs = " ".join(f"{env} {value:.3f}" for env, value in row["champion"].items() if env != "overall")
    extra = (f"skipped groups {row['skipped_groups']}/{row['groups']}, KL last {row['kl_last']}"
             if row["mode"].split("+")[0] == "grpo" else f"trained on {row['trained_on']}")
    if row.get("episodes"):
        extra += (f" batch first/final attempt {row['episodes']['first_pass_rate']:.3f}/"
                  f"{row['episodes']['final_pass_rate']:.3f}")
    if row.get("round_pass_rates"):
        extra += " rounds' pass rates " + " ".join(f"{v:.3f}" for v in row["round_pass_rates"].values())
    again = f"measured again: {', '.join(row['measured_again'])} | " if row.get("measured_again") else ""
    return (f"{row['mode']:<5} it {row['iteration']}  champion {row['champion']['overall']:.3f} ({gain:+.1f} pp)  "
            f"candidate {row['candidate']['overall']:.3f}  {'promoted' if row['promoted'] else 'held'}  | {envs} | "
            f"positives {row['positives']} fixes {row['fix_pairs']} {extra} | "
            f"{again}"
            f"train {row['train_tokens_per_s']:.0f} tok/s | {row['wall_s']:.0f} s")


def paired_difference(before: dict[str, int], after: dict[str, int], n: int, tasks: list) -> dict[str, dict]:
    """Per environment, overall, and apart for the slices training draws from ("in-distribution") and
    the held-out slice (families or compositions train never emits): mean of after − before pass@1 over
    tasks, and its standard error."""
    import math

    from closedloop.envs.base import HELDOUT

    groups: dict[str, list[float]] = {"overall": []}
    for task in tasks:
        diff = (after[task.task_id] - before[task.task_id]) / n
        groups.setdefault(task.env, []).append(diff)
        groups["overall"].append(diff)
        groups.setdefault(HELDOUT if task.slice == HELDOUT else "in-distribution", []).append(diff)
    out = {}
    for name, diffs in groups.items():
        mean = sum(diffs) / len(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
        out[name] = {"diff": mean, "se": math.sqrt(var / len(diffs))}
    return out


def final_model(ws) -> Path:
    """The model an arm ends with: the last iteration's promote output (its candidate when promoted,
    else the champion it kept). Not data/champion: the loop closes at the start of the next iteration,
    so after the last one data/champion is still the model that iteration began from."""
    return ws.next_champion if ws.next_champion.exists() else ws.champion


def arm_dir(arm: str) -> str:
    """The workspace folder of an arm ("rft+sample.rounds=3" → "rft+sample.rounds-3")."""
    return arm.replace("=", "-").replace("/", "-")


def final_check(base: Path, finals: dict[str, Path], samples: int, rounds: int = 1,
                overrides: list[str] = (), saved: Path | None = None) -> dict:
    """The warm start and each mode's final champion, evaluated again with ``samples`` per task; with
    ``rounds`` > 1 as episodes, each also after round 1 and paired against its own round 1. Every model
    is measured under the same params: the warm start's, with ``overrides`` (``SECTION.KEY=YAML``) laid
    over them (e.g. sample.trim_transcript=true when an arm trained with it). With ``saved`` (a folder),
    each model's measurement is kept there and reused by a later check of the same model under the same
    settings, so the models of a long experiment can be measured as each arm finishes."""
    from closedloop.envs.base import load_tasks
    from closedloop.evaluation.runner import evaluate_policy
    from closedloop.models.loading import model_fingerprint
    from closedloop.rewards.pools import EnvPools
    from closedloop.workspace import Workspace

    ws = Workspace.at(base)
    params = overridden(base, [*overrides, f"sample.rounds={rounds}"])
    tasks = load_tasks(ws.benchmark_tasks)
    models = {"warm_start": ws.warmstart_model, **finals}
    measured: dict[str, dict] = {}
    with EnvPools(params) as verifiers:
        for name, model in models.items():
            key = {"model": model_fingerprint(Path(model)), "samples": samples, "rounds": rounds,
                   "overrides": sorted(overrides)}
            path = saved / f"{arm_dir(name)}.json" if saved else None
            if path and path.exists() and json.loads(path.read_text())["key"] == key:
                measured[name] = json.loads(path.read_text())["result"]
                continue
            result = evaluate_policy(model, tasks, params=params, samples_per_task=samples,
                                     seed=params.stage_seed("final_check", False),
                                     batch_size=params.evaluate.batch_size, verifiers=verifiers)
            measured[name] = {part: result[part] for part in ("summary", "per_task", "rounds") if part in result}
            if path:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"key": key, "result": measured[name]}, default=str) + "\n")
    return compare_measured(measured, samples, tasks, rounds)


def compare_measured(measured: dict[str, dict], samples: int, tasks: list, rounds: int) -> dict:
    """The final check's figures from each model's measurement ("warm_start" first): pass@1, paired
    differences against the warm start, and with episodes against each model's own first round."""
    warm = measured["warm_start"]
    results = {"warm_start": pass_rates(warm["summary"])}
    if rounds > 1:
        results["warm_start_round_1"] = pass_rates(warm["rounds"]["by_round"][0])
        results["by_round"] = {name: [pass_rates(r) for r in m["rounds"]["by_round"]] for name, m in measured.items()}
    firsts: dict[str, dict] = {}
    finals = [name for name in measured if name != "warm_start"]
    for mode in finals:
        final = measured[mode]
        results[mode] = {"pass@1": pass_rates(final["summary"]),
                         "vs_warm_start": paired_difference(warm["per_task"], final["per_task"], samples, tasks)}
        if rounds > 1:
            first = firsts[mode] = final["rounds"]["per_task_by_round"][0]
            results[mode]["round_1"] = pass_rates(final["rounds"]["by_round"][0])
            results[mode]["correction_rate"] = final["rounds"]["correction_rate"]
            # what the later rounds add to this model's own first attempts
            results[mode]["rounds_vs_round_1"] = paired_difference(first, final["per_task"], samples, tasks)
            results[mode]["round_1_vs_warm_start_round_1"] = paired_difference(
                warm["rounds"]["per_task_by_round"][0], first, samples, tasks)
    for i, a in enumerate(finals if rounds > 1 else []):
        for b in finals[i + 1:]:  # every pair of arms, first attempts against first attempts
            results[f"{b} vs {a}, round 1"] = paired_difference(firsts[a], firsts[b], samples, tasks)
    return results


def minutes_curve(rows: list[dict], warm: dict) -> list[tuple[float, float]]:
    """A mode's champion pass@1 against the cumulative minutes of its iterations, from the warm start."""
    points, total = [(0.0, warm["overall"])], 0.0
    for row in rows:
        total += row["wall_s"] / 60
        points.append((round(total, 2), row["champion"]["overall"]))
    return points


def compare_table(rows: list[dict], trl: dict, warm: dict) -> str:
    """Both curves, pass@1 against minutes, one line per measured point, and each one's gain per minute."""
    lines = ["| trainer | minutes | pass@1 | gain (pp) | pp per minute |", "|---|---|---|---|---|"]
    curves = {mode: minutes_curve([r for r in rows if r["mode"] == mode], warm)
              for mode in sorted({row["mode"] for row in rows})}
    curves["trl"] = [(0.0, warm["overall"])] + [(p["minutes"], p["pass@1"]["overall"]) for p in trl["curve"]]
    for name, points in curves.items():
        for minutes, value in points:
            gain = (value - warm["overall"]) * 100
            rate = f"{gain / minutes:+.2f}" if minutes else ""
            lines.append(f"| {name} | {minutes:.1f} | {value:.3f} | {gain:+.1f} | {rate} |")
    return "\n".join(lines)


def plot_minutes(rows: list[dict], trl: dict, warm: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for mode in sorted({row["mode"] for row in rows}):
        points = minutes_curve([r for r in rows if r["mode"] == mode], warm)
        ax.plot(*zip(*points), marker="o", label=f"closedloop {mode}")
    ax.plot([0.0] + [p["minutes"] for p in trl["curve"]], [warm["overall"]] + [p["pass@1"]["overall"] for p in trl["curve"]],
            marker="s", label="TRL GRPOTrainer")
    ax.set_xlabel("wall-clock minutes (2-core CPU)")
    ax.set_ylabel("benchmark pass@1")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def plot_rounds(by_round: dict[str, list[dict]], path: Path) -> None:
    """Each model's benchmark pass@1 after round 1, 2, …, R of its episodes (the final check's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, rounds in by_round.items():
        ax.plot(range(1, len(rounds) + 1), [r["overall"] for r in rounds], marker="o", label=name)
    ax.set_xlabel("after round")
    ax.set_xticks(range(1, max(len(r) for r in by_round.values()) + 1))
    ax.set_ylabel("benchmark pass@1 (hidden checks)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def overridden(root: Path, items: list[str]):
    """The params of workspace ``root`` with ``SECTION.KEY=YAML`` overrides laid over them (validated)."""
    import yaml

    from closedloop.config import load_params, parse_params

    data = load_params(root).model_dump(mode="json")
    for item in items:
        dotted, _, value = item.partition("=")
        *path, key = dotted.split(".")
        node = data
        for part in path:
            node = node[part]
        node[key] = yaml.safe_load(value)
    return parse_params(data, "--set")


def apply_overrides(root: Path, items: list[str]) -> None:
    """Lay ``--set SECTION.KEY=YAML`` overrides over the params.yaml of workspace ``root``."""
    from closedloop.config import write_params

    write_params(root, overridden(root, items))


def save(figures: dict, path: Path | None) -> None:
    """Write the figures so far (after every iteration, so an interrupted run keeps what it measured)."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=1) + "\n")


def plot(rows: list[dict], warm: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = [env for env in warm if env != "overall"]
    modes = sorted({row["mode"] for row in rows})
    fig, axes = plt.subplots(1, len(envs) + 1, figsize=(3.2 * (len(envs) + 1), 3.2), sharey=True)
    for ax, key in zip(axes, ["overall", *envs]):
        for mode in modes:
            mine = [row for row in rows if row["mode"] == mode]
            ax.plot([0] + [row["iteration"] for row in mine], [warm[key]] + [row["champion"][key] for row in mine],
                    marker="o", label=mode)
        ax.set_title(key)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("benchmark pass@1 (champion)")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="rft,grpo", help="comma-separated training modes, each from the warm start")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--workdir", type=Path, help="where the workspaces go (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--plot", type=Path, help="write the curves (PNG) here")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=YAML",
                        help="override a param for every mode, e.g. --set generate.n_tasks=400")
    parser.add_argument("--from-warmstart", type=Path, metavar="WORKSPACE",
                        help="start every mode from this warm-started workspace (e.g. WORKDIR/warmstart of an "
                             "earlier run) instead of running the warm start")
    parser.add_argument("--final-samples", type=int, default=32,
                        help="samples per task when the warm start and the final champions are evaluated "
                             "again at the end (0: skip)")
    parser.add_argument("--final-rounds", type=int, default=1,
                        help="evaluate the final check as episodes of this many rounds (sample.rounds), each model "
                             "also after round 1")
    parser.add_argument("--final-set", action="append", default=[], metavar="SECTION.KEY=YAML",
                        help="override a param of the final check only, for every model alike "
                             "(e.g. --final-set sample.trim_transcript=true)")
    parser.add_argument("--compare", choices=["trl"], help="also run the reference trainer (TRL's GRPOTrainer) from "
                        "the same warm start for the best mode's wall-clock, on its training tasks")
    parser.add_argument("--trl-minutes", type=float, help="TRL's training budget (default: the best mode's minutes)")
    parser.add_argument("--trl-points", type=int, default=5, help="policies saved and evaluated along TRL's run")
    parser.add_argument("--trl-lr", type=float, help="TRL's learning rate (default: train.grpo.lr)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from closedloop.cli import quiet_prefect

    quiet_prefect()
    from closedloop.config import load_params, write_params
    from closedloop.envs.base import load_tasks
    from closedloop.io import read_json
    from closedloop.scaffold import init_workspace
    from closedloop.workspace import Workspace
    from flows.loop import closed_loop

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="closedloop-learning-"))
    base = workdir / "warmstart"
    if args.from_warmstart:
        base = args.from_warmstart.resolve()
        if not Workspace.at(base).warmstart_eval.exists():
            raise SystemExit(f"{base}: no warm start there ({Workspace.at(base).warmstart_eval} is missing)")
    else:
        shutil.rmtree(base, ignore_errors=True)
        init_workspace(base)
    if args.set and not args.from_warmstart:
        apply_overrides(base, args.set)  # this run's own warm start: it trains under them too
    started = time.perf_counter()
    if not args.from_warmstart:
        closed_loop(iterations=0, workspace=str(base))
    warm_seconds = time.perf_counter() - started if not args.from_warmstart else float(
        read_json(base / "metrics/timing/warmstart.json")["seconds"])
    warm = pass_rates(read_json(Workspace.at(base).warmstart_eval)["summary"])
    print(f"warm start  pass@1 {warm['overall']:.3f}  | "
          + " ".join(f"{env} {value:.3f}" for env, value in warm.items() if env != "overall")
          + f" | {warm_seconds:.0f} s", flush=True)

    rows: list[dict] = []
    drawn: dict[str, list] = {}  # each mode's training tasks, iteration by iteration (TRL trains on the best's)
    figures = {"warm_start": warm, "warm_start_seconds": round(warm_seconds, 1), "iterations": rows,
               "overrides": args.set}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        # An arm: a training mode, and (after "+") overrides of its own, e.g. rft+sample.rounds=3.
        train_mode, *arm_sets = mode.split("+")
        root = workdir / arm_dir(mode)
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(base, root, symlinks=True)
        shutil.rmtree(root / "data" / "models" / "candidate.checkpoint", ignore_errors=True)
        init_workspace(root)  # dvc.yaml rendered from this code (a reused warm start may predate it)
        if args.set and args.from_warmstart:
            apply_overrides(root, args.set)  # the copy's, never the reused warm start's own params.yaml
        if arm_sets:
            apply_overrides(root, arm_sets)
        params = load_params(root)
        params.train.mode = train_mode
        write_params(root, params)
        for iteration in range(1, args.iterations + 1):
            started = time.perf_counter()
            closed_loop(iterations=1, workspace=str(root))
            row = iteration_row(Workspace.at(root), mode, iteration, time.perf_counter() - started)
            rows.append(row)
            drawn.setdefault(mode, []).extend(load_tasks(Workspace.at(root).tasks))
            print(describe(row, warm), flush=True)
            save(figures, args.out)
            if args.plot:
                plot(rows, warm, args.plot)

    print("\nsummary (champion pass@1 against the warm start)")
    for mode in sorted({row["mode"] for row in rows}):
        mine = [row for row in rows if row["mode"] == mode]
        best = max(mine, key=lambda row: row["champion"]["overall"])
        last = mine[-1]
        below = [env for env in warm if env != "overall" and last["champion"][env] < warm[env]]
        tokens_per_s = sum(row["train_tokens"] for row in mine) / max(1e-9, sum(row["train_seconds"] for row in mine))
        print(f"{mode:<5} best {best['champion']['overall']:.3f} at iteration {best['iteration']} "
              f"({(best['champion']['overall'] - warm['overall']) * 100:+.1f} pp); final "
              f"{last['champion']['overall']:.3f} ({(last['champion']['overall'] - warm['overall']) * 100:+.1f} pp); "
              f"environments ending below the warm start: {', '.join(below) or 'none'}; "
              f"training {tokens_per_s:.0f} tokens/s; {sum(row['wall_s'] for row in mine) / len(mine):.0f} s/iteration; "
              f"{(last['champion']['overall'] - warm['overall']) * 100 / (sum(row['wall_s'] for row in mine) / 60):+.2f} "
              "pp per minute of iterations")
    finals = {mode: final_model(Workspace.at(workdir / arm_dir(mode))) for mode in sorted({row["mode"] for row in rows})}
    if args.compare == "trl" and rows:
        import trl_compare

        best = max(finals, key=lambda mode: [r for r in rows if r["mode"] == mode][-1]["champion"]["overall"])
        budget_s = args.trl_minutes * 60 if args.trl_minutes else sum(r["wall_s"] for r in rows if r["mode"] == best)
        print(f"\ntrl   GRPOTrainer from the warm start on {best}'s {len(drawn[best])} training tasks, "
              f"{budget_s / 60:.1f} min budget", flush=True)
        trl = trl_compare.run_trl(base, drawn[best], budget_s=budget_s, out_dir=workdir / "trl", points=args.trl_points,
                                  lr=args.trl_lr, seed=load_params(base).project.seed,
                                  echo=lambda line: print(line, flush=True))
        figures["trl"] = {"against": best, **trl}
        finals["trl"] = Path(trl["final_model"])
        print("\n" + compare_table(rows, trl, warm), flush=True)
        save(figures, args.out)
        if args.plot:
            plot_minutes(rows, trl, warm, args.plot.with_name(args.plot.stem + "_minutes.png"))
    if args.final_samples and rows:
        check = final_check(base, finals, args.final_samples, args.final_rounds, args.final_set,
                            saved=args.workdir / "measured" if args.workdir else None)
        figures["final_check"] = {"samples_per_task": args.final_samples, "rounds": args.final_rounds,
                                  "overrides": args.final_set, **check}
        print(f"\nfinal champions against the warm start, {args.final_samples} samples per task (paired; ± one "
              f"standard error over tasks)")
        print("warm start  " + " ".join(f"{k} {v:.3f}" for k, v in check["warm_start"].items()))
        for mode in finals:
            diffs = check[mode]["vs_warm_start"]
            print(f"{mode:<5} final " + " ".join(f"{k} {v:.3f}" for k, v in check[mode]["pass@1"].items()))
            print("      change " + " ".join(f"{k} {d['diff'] * 100:+.1f}±{d['se'] * 100:.1f} pp"
                                         for k, d in diffs.items()))
            if "round_1" in check[mode]:
                print("      after round 1 " + " ".join(f"{k} {v:.3f}" for k, v in check[mode]["round_1"].items()))
                for key, label in (("rounds_vs_round_1", f"round {args.final_rounds} vs its round 1"),
                                   ("round_1_vs_warm_start_round_1", "round 1 vs the warm start's round 1")):
                    print(f"      {label}: " + " ".join(f"{k} {d['diff'] * 100:+.1f}±{d['se'] * 100:.1f} pp"
                                                      for k, d in check[mode][key].items()))
        if args.plot and "by_round" in check:
            plot_rounds(check["by_round"], args.plot.with_name(args.plot.stem + "_rounds.png"))
        for key in [k for k in check if k.endswith(", round 1")]:
            print(f"{key}: " + " ".join(f"{k} {d['diff'] * 100:+.1f}±{d['se'] * 100:.1f} pp"
                                       for k, d in check[key].items()))
        save(figures, args.out)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
