"""Do two revisions of closedloop produce the same outputs? A warm start and N iterations on the tiny
params (tests/tiny.py), run by each revision's own code through `closedloop run`, then every DVC output
of every stage compared by its md5 and every stage's metrics file compared with its timing left out.

    python benchmarks/same_outputs.py --before 61ad117 --after HEAD [--iterations 1]

Two kinds of field differ by design and are compared apart: the version of each feedback source (a hash
of the source's code, so a revision that moves or edits a verifier's code changes those strings), and
wall-clock figures (seconds, throughput, the timing files, GX's Data Docs pages with their run
timestamps). A file that differs is compared again without them, and the report says which files
differ and what explains it. Exit status 0 when every output is the same or differs only in those.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny import TINY  # noqa: E402

VERSION_KEYS = ("version", "versions", "feedback_sources", "source_versions", "verifier_version", "combiner")
WALL_CLOCK_SUFFIXES = ("_per_s", "seconds", "_ms")
WALL_CLOCK_FILES = ("metrics/timing/", "data/batch/sample_timings.jsonl")
WALL_CLOCK_DIRS = ("docs",)  # GX's Data Docs: HTML pages named and stamped by the validation run's time


def export(rev: str, dest: Path) -> Path:
    """The revision's tree, as `git archive` gives it (no .git, no venv)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_loop(code: Path, workspace: Path, iterations: int) -> float:
    """Init a workspace with the tiny params and run the loop with ``code`` first on the path."""
    workspace.mkdir(parents=True)
    (workspace / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(code), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"from closedloop.scaffold import init_workspace; "
                    f"init_workspace({str(workspace)!r})"], env=env, cwd=workspace, check=True)
    subprocess.run([sys.executable, "-m", "closedloop.cli", "run", "--iterations", str(iterations),
                    "--workspace", str(workspace)], env=env, cwd=workspace, check=True)
    return time.perf_counter() - started


def outputs(workspace: Path) -> dict[str, str]:
    """Every stage output dvc.lock records (path → md5), and the data files under data/batch."""
    lock = yaml.safe_load((workspace / "dvc.lock").read_text())
    found = {}
    for stage in lock["stages"].values():
        for out in stage.get("outs", []):
            found[out["path"]] = out.get("md5", "")
    return found


def without_versions(value):
    if isinstance(value, dict):
        return {key: without_versions(item) for key, item in value.items()
                if key not in VERSION_KEYS and not key.endswith("_version")
                and not key.endswith(WALL_CLOCK_SUFFIXES)}
    if isinstance(value, list):
        return [without_versions(item) for item in value]
    return value


def same_but_versions(a: Path, b: Path) -> bool:
    """Whether two JSON / JSONL files are equal once the feedback sources' versions are left out."""
    def rows(path: Path):
        text = path.read_text()
        if path.suffix == ".jsonl":
            return [without_versions(json.loads(line)) for line in text.splitlines() if line.strip()]
        return without_versions(json.loads(text))
    try:
        return rows(a) == rows(b)
    except (ValueError, UnicodeDecodeError, IsADirectoryError):
        return False


def digest(path: Path) -> str:
    if path.is_dir():
        files = [p for p in sorted(path.rglob("*"))
                 if p.is_file() and p.relative_to(path).parts[0] not in WALL_CLOCK_DIRS]
        return hashlib.sha256("".join(f"{p.relative_to(path)}:{digest(p)}" for p in files).encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def metrics(workspace: Path) -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted((workspace / "metrics").glob("*.json"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--iterations", type=int, default=1)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="same-outputs-"))
    runs = {}
    for label, rev in (("before", args.before), ("after", args.after)):
        code = export(rev, scratch / label / "code")
        # Both run at one path, then move aside: records that name the workspace's path (the GX report's
        # Data Docs index, MLflow's store) are then the same bytes.
        seconds = run_loop(code, scratch / "ws", args.iterations)
        runs[label] = (scratch / "ws").rename(scratch / label / "ws")
        print(f"{label}: {rev} ran a warm start and {args.iterations} iteration(s) in {seconds:.0f} s")
    before, after = outputs(runs["before"]), outputs(runs["after"])
    identical, clock_only, versions_only, different = [], [], [], []
    for path in sorted(set(before) | set(after)):
        a, b = runs["before"] / path, runs["after"] / path
        if before.get(path) == after.get(path):
            identical.append(path)
        elif path.startswith(WALL_CLOCK_FILES) or (a.is_dir() and b.is_dir() and digest(a) == digest(b)):
            clock_only.append(path)
        elif a.is_file() and b.is_file() and same_but_versions(a, b):
            versions_only.append(path)
        else:
            different.append(path)
    numbers_before, numbers_after = metrics(runs["before"]), metrics(runs["after"])
    metric_diffs = [name for name in sorted(set(numbers_before) | set(numbers_after))
                    if numbers_before.get(name) != numbers_after.get(name)]
    print(f"outputs: {len(identical)} byte-identical, {len(clock_only)} wall-clock figures alone, "
          f"{len(versions_only)} equal but for the feedback sources' versions and wall-clock figures, "
          f"{len(different)} different (of {len(set(before) | set(after))})")
    for path in clock_only:
        print(f"  wall-clock only: {path}")
    for path in versions_only:
        print(f"  versions / wall-clock only: {path}")
    for path in different:
        print(f"  DIFFERENT: {path}")
    print(f"metrics files: {len(numbers_before) - len(metric_diffs)} of {len(numbers_before)} equal"
          + (f"; different: {metric_diffs}" if metric_diffs else ""))
    print(f"workspaces kept under {scratch}")
    return 0 if not different and not metric_diffs else 1


if __name__ == "__main__":
    sys.exit(main())
