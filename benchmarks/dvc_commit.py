"""What recording an iteration in DVC costs, against the stage code deps of a baseline revision.

Every stage the flow runs is recorded with ``DvcWorkspace.commit`` (stages/recorded.py), and DVC
rewrites the whole dvc.lock each time (a round-trip YAML parse and dump), so the cost grows with the
lock, which is mostly the stages' code deps (pipeline.stage_code). Baseline: the same workspace with
dvc.yaml rendered by the package of ``--baseline-rev`` (its code deps). Both copies are recorded with
today's DvcWorkspace, each stage once untimed (so the lock holds that rendering's deps), then each
stage once timed, as one iteration records them.

    python benchmarks/iteration.py --keep /tmp/ws          # any workspace that ran an iteration
    python benchmarks/dvc_commit.py /tmp/ws --baseline-rev 214778b
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
RENDER = "import sys; from closedloop.pipeline import render_yaml; sys.stdout.write(render_yaml(sys.argv[1]))"


def rendering_of(package_parent: Path, code_dir: Path) -> str:
    """dvc.yaml as the closedloop package under ``package_parent`` renders it, naming ``code_dir``."""
    return subprocess.run([sys.executable, "-c", RENDER, str(code_dir)], cwd=package_parent, check=True,
                          capture_output=True, text=True, env={"PYTHONPATH": str(package_parent)}).stdout


def timed_commits(workspace: Path, dvc_yaml: str) -> tuple[dict[str, float], int, int]:
    """Per stage seconds of one commit, dvc.lock bytes and the number of code deps recorded."""
    import yaml

    from closedloop.lineage.dvc import DvcWorkspace

    (workspace / "dvc.yaml").write_text(dvc_yaml)
    stages = list(yaml.safe_load(dvc_yaml)["stages"])
    ws = DvcWorkspace(workspace)
    for stage in stages:
        ws.commit(stage)  # the lock now holds this rendering's deps, as after a run on that code
    seconds = {}
    for stage in stages:
        started = time.perf_counter()
        ws.commit(stage)
        seconds[stage] = time.perf_counter() - started
    lock = (workspace / "dvc.lock").read_text()
    code_deps = sum(1 for line in lock.splitlines() if line.strip().startswith("- path:") and ".py" in line)
    return seconds, len(lock.encode()), code_deps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path, help="a workspace that ran at least one iteration (left untouched)")
    parser.add_argument("--baseline-rev", required=True, help="the git revision whose stage code deps are the baseline")
    args = parser.parse_args()
    if not (args.workspace / "dvc.lock").exists():
        raise SystemExit(f"{args.workspace}/dvc.lock: missing; run benchmarks/iteration.py --keep {args.workspace}")
    with tempfile.TemporaryDirectory(prefix="dvc-commit-") as temp:
        temp = Path(temp)
        old_code = temp / "baseline"
        old_code.mkdir()
        archive = subprocess.run(["git", "archive", args.baseline_rev, "closedloop"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_code)], input=archive, check=True)
        results = {}
        for label, parent in (("baseline", old_code), ("today", REPO)):
            copy = temp / f"ws-{label}"
            shutil.copytree(args.workspace, copy, symlinks=True)
            results[label] = timed_commits(copy, rendering_of(parent, parent / "closedloop"))
    base, now = results["baseline"], results["today"]
    print(f"{'stage':<11} {'baseline s':>10} {'today s':>8}")
    for stage in base[0]:
        print(f"{stage:<11} {base[0][stage]:>10.2f} {now[0].get(stage, float('nan')):>8.2f}")
    total_base, total_now = sum(base[0].values()), sum(now[0].values())
    print(f"{'total':<11} {total_base:>10.2f} {total_now:>8.2f}   ratio today/baseline {total_now / total_base:.2f}")
    print(f"code deps in dvc.lock: baseline {base[2]} ({args.baseline_rev}), today {now[2]}; "
          f"dvc.lock {base[1] / 1000:.0f} kB -> {now[1] / 1000:.0f} kB")


if __name__ == "__main__":
    main()
