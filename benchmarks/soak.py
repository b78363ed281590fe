"""Soak: N tiny closed-loop iterations back to back in one process; do fds, processes, memory, threads
and disk stay flat?

Runs the warm start, then ``iteration_flow`` N times in this process on a fresh workspace (tiny params,
Prefect's ephemeral API), and after the warm start and after each iteration measures, with psutil:

* this process: open file descriptors, threads, RSS;
* processes: this process's live descendants (recursively: the ephemeral Prefect server, sandbox
  workers, anything a stage left running) and leftovers, i.e. processes started during the run that are
  not descendants (orphans) but belong to it: their cwd, command line or PREFECT_HOME points into this
  run's scratch directory or workspace (TMPDIR and PREFECT_HOME are set in the scratch directory, so a
  sandbox pool's scratch, and the Prefect server's environment, say whose they are);
* disk of the workspace, counted like ``du`` (allocated blocks, a hard-linked file once, in the first
  place that holds it): .dvc/cache, the DVC remote (.dvc-remote), MLflow (mlflow.db + mlartifacts),
  .git, data/ and the rest; its growth since the previous row; the batch (data/batch, counted on its
  own, links followed), the part of it the DVC cache did not hold before ("batch new": a tracked file is
  a hard link to its cache object), and the candidate model (data/models/candidate); outside the
  workspace, PREFECT_HOME (the ephemeral server's database) and TMPDIR (temp files nobody removed).

Then prints one verdict line per resource: first→last (iteration 1 → N), and the slope per iteration
(least squares over iterations 2..N: iteration 1 pays one-off imports and caches). Baseline for disk:
growth per iteration / batch size = 1.0 (the workspace grows only by the batch it versions); the same
ratio against batch + candidate model, and against the batch's new bytes + model, is printed next to it.

    python benchmarks/soak.py                        # 10 iterations, temp dir removed at the end (~5-10 min)
    python benchmarks/soak.py --iterations 3 --workspace /tmp/soak-ws --json /tmp/soak.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.tiny import TINY  # noqa: E402  (the params the tests run on)

# Where workspace bytes are attributed: a file linked from several places counts in the first.
PLACES = (
    ("cache", (".dvc/cache",)),
    ("remote", (".dvc-remote",)),
    ("mlflow", ("mlflow.db", "mlartifacts")),
    ("git", (".git",)),
    ("data", ("data",)),
)
OTHER = "other"
ORDER = [name for name, _ in PLACES] + [OTHER]
BATCH = "data/batch"
CANDIDATE = "data/models/candidate"
KIB = 1024


def setup_env(scratch: Path) -> None:
    """As `closedloop run` sets it (cli.main + quiet_prefect), plus an ephemeral Prefect API whose home
    and temp files live in this run's scratch dir."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("PREFECT_API_URL", None)
    os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "240"
    for name in ("prefect-home", "tmp"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    os.environ["PREFECT_HOME"] = str(scratch / "prefect-home")
    os.environ["TMPDIR"] = str(scratch / "tmp")
    tempfile.tempdir = str(scratch / "tmp")  # tempfile caches the first answer


# -- disk ------------------------------------------------------------------------------------------
def place_of(relative: str) -> str:
    for name, prefixes in PLACES:
        if any(relative == p or relative.startswith(p + "/") for p in prefixes):
            return name
    return OTHER


def workspace_disk(root: Path) -> tuple[dict[str, int], set[tuple[int, int]]]:
    """Allocated bytes per place, an inode once (in the first place of PLACES that holds it); and the
    inodes of the DVC cache."""
    files: dict[str, list[os.stat_result]] = {name: [] for name in ORDER}
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            path = Path(dirpath) / filename
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            files[place_of(path.relative_to(root).as_posix())].append(st)
    seen: set[tuple[int, int]] = set()
    out = {}
    for name in ORDER:
        total = 0
        for st in files[name]:
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
        out[name] = total
    out["total"] = sum(out[name] for name in ORDER)
    return out, {(st.st_dev, st.st_ino) for st in files["cache"]}


def tree_disk(path: Path, known: set[tuple[int, int]] | None = None) -> int:
    """Allocated bytes under ``path`` on its own, links followed, an inode once (none of ``known``)."""
    seen: set[tuple[int, int]] = set(known or ())
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for filename in filenames:
            try:
                st = (Path(dirpath) / filename).stat()
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


# -- processes -------------------------------------------------------------------------------------
def process_figures(me, markers: tuple[str, ...], started: float) -> dict:
    """``markers``: the scratch dir and the workspace; a process whose cwd or command line names one is ours."""
    import psutil

    children = me.children(recursive=True)
    child_pids = {p.pid for p in children}
    child_rss, names = 0, []
    for child in children:
        try:
            child_rss += child.memory_info().rss
            names.append(" ".join(child.cmdline())[:110])
        except psutil.Error:
            pass
    leftover_roots = []
    uid = os.getuid()
    for proc in psutil.process_iter(["pid", "create_time", "uids", "cmdline", "cwd"]):
        info = proc.info
        if (info["pid"] == me.pid or info["pid"] in child_pids or not info["uids"] or info["uids"].real != uid
                or (info["create_time"] or 0) < started):
            continue
        ours = any(m in (info["cwd"] or "") or any(m in arg for arg in info["cmdline"] or ()) for m in markers)
        if not ours:
            try:
                ours = proc.environ().get("PREFECT_HOME", "").startswith(markers[0])
            except psutil.Error:
                pass
        if ours:
            leftover_roots.append(proc)
    leftovers = {p.pid: " ".join(p.info["cmdline"] or ())[:110] for p in leftover_roots}
    for root in leftover_roots:
        try:
            for p in root.children(recursive=True):
                leftovers.setdefault(p.pid, " ".join(p.cmdline())[:110])
        except psutil.Error:
            pass
    with me.oneshot():
        return {"fds": me.num_fds(), "threads": me.num_threads(), "rss": me.memory_info().rss,
                "children": len(children), "child_rss": child_rss, "leftovers": len(leftovers),
                "child_cmdlines": sorted(names), "leftover_cmdlines": sorted(leftovers.values())}


def measure(me, root: Path, scratch: Path, started: float, cache_before: set[tuple[int, int]]) -> dict:
    """One row; ``cache_before`` (the DVC cache's inodes at the previous row) is updated in place."""
    row = process_figures(me, (str(scratch), str(root)), started)
    row["disk"], cache_now = workspace_disk(root)
    row["batch"] = tree_disk(root / BATCH)
    # The batch's bytes the cache did not hold before: a tracked file is a hard link to its cache
    # object, so a file identical to an earlier iteration's (GX Data Docs' static assets) is known.
    row["batch_new"] = tree_disk(root / BATCH, cache_before)
    cache_before.clear()
    cache_before.update(cache_now)
    row["model"] = tree_disk(root / CANDIDATE)
    row["prefect_home"] = tree_disk(scratch / "prefect-home")
    row["tmp"] = tree_disk(scratch / "tmp")
    row["tmp_entries"] = sorted(os.listdir(scratch / "tmp"))
    return row


# -- report ----------------------------------------------------------------------------------------
def slope(ys: list[float]) -> float:
    """Least-squares slope per step of ys at x = 0, 1, 2, ..."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def kib(n: float) -> str:
    return f"{n / KIB:,.0f}"


def label(row: dict) -> str:
    return "warm" if row["iteration"] == 0 else str(row["iteration"])


def process_line(row: dict) -> str:
    return (f"{label(row):>5} {row['seconds']:>6.1f} {row['fds']:>5} {row['children']:>8} {row['leftovers']:>8} "
            f"{row['rss'] / 2**20:>8.1f} {row['child_rss'] / 2**20:>10.1f} {row['threads']:>7}")


PROCESS_HEADER = (f"{'iter':>5} {'s':>6} {'fds':>5} {'children':>8} {'leftover':>8} {'RSS MB':>8} "
                  f"{'child RSS':>10} {'threads':>7}")


def disk_line(row: dict, previous: dict | None) -> str:
    d = row["disk"]
    growth = d["total"] - previous["disk"]["total"] if previous else None
    cells = [f"{label(row):>5}"] + [f"{kib(d[name]):>8}" for name in ORDER] + [f"{kib(d['total']):>8}"]
    ratio = f"{growth / row['batch']:.2f}" if growth is not None and row["batch"] else ""
    cells += [f"{kib(growth) if growth is not None else '':>8}", f"{kib(row['batch']):>7}",
              f"{kib(row['batch_new']):>9}", f"{kib(row['model']):>7}", f"{ratio:>7}",
              f"{kib(row['prefect_home']):>8}", f"{kib(row['tmp']):>6}"]
    return " ".join(cells)


DISK_HEADER = " ".join([f"{'iter':>5}"] + [f"{n:>8}" for n in ORDER] + [f"{'total':>8}", f"{'growth':>8}",
                                                                         f"{'batch':>7}", f"{'batch new':>9}",
                                                                         f"{'model':>7}",
                                                                         f"{'g/batch':>7}", f"{'prefect':>8}",
                                                                         f"{'tmp':>6}"])


def verdicts(rows: list[dict]) -> list[str]:
    its = [r for r in rows if r["iteration"] > 0]
    if not its:
        return ["no iteration finished"]
    n = its[-1]["iteration"]
    steady = its[1:] if len(its) > 2 else its
    span = f"iter 1→{n}"
    lines = []

    def resource(name: str, values: list[float], unit: str, fmt: str = "{:.0f}") -> None:
        s = slope(values[1:] if len(values) > 2 else values)
        lines.append(f"{name:<22} {span}: {fmt.format(values[0])} → {fmt.format(values[-1])} {unit}; "
                     f"slope {s:+.2f} {unit}/iteration")

    resource("open files (fds)", [r["fds"] for r in its], "fds")
    resource("child processes", [r["children"] for r in its], "procs")
    resource("leftover processes", [r["leftovers"] for r in its], "procs")
    resource("threads", [r["threads"] for r in its], "threads")
    resource("RSS", [r["rss"] / 2**20 for r in its], "MB", "{:.1f}")
    resource("child RSS", [r["child_rss"] / 2**20 for r in its], "MB", "{:.1f}")
    for name in ORDER + ["total"]:
        resource(f"disk {name}", [r["disk"][name] / KIB for r in its], "KiB")
    resource("PREFECT_HOME (outside)", [r["prefect_home"] / KIB for r in its], "KiB")
    resource("TMPDIR (outside)", [r["tmp"] / KIB for r in its], "KiB")
    # Disk growth per iteration vs the batch: over all iterations (from the warm start's row, so the
    # first iteration's one-off stores count) and in steady state (the slope over iterations 2..N).
    first = rows[0] if rows[0]["iteration"] == 0 else its[0]
    count = n - first["iteration"]
    if count:
        def mean(key: str, of: list[dict]) -> float:
            return sum(r[key] for r in of) / len(of)

        growth = (its[-1]["disk"]["total"] - first["disk"]["total"]) / count
        later = its[1:] or its  # the iterations after the first, whose batches are steady state
        steady_growth = slope([r["disk"]["total"] for r in steady])
        for what, all_, steady_ in (
            ("batch", mean("batch", its[-count:]), mean("batch", later)),
            ("batch + model", mean("batch", its[-count:]) + mean("model", its[-count:]),
             mean("batch", later) + mean("model", later)),
            ("batch's new bytes + model", mean("batch_new", its[-count:]) + mean("model", its[-count:]),
             mean("batch_new", later) + mean("model", later)),
        ):
            steady_part = (f"; steady (iters 2..{n}) {kib(steady_growth)} / {kib(steady_)} KiB"
                           f" = {steady_growth / steady_:.2f}" if len(steady) > 1 else "")
            lines.append(f"disk growth / {what:<26} all iterations {kib(growth)} / {kib(all_)} KiB = "
                         f"{growth / all_:.2f}{steady_part}"
                         + ("   (baseline 1.0: grows only by the batch)" if what == "batch" else ""))
    return lines


def report(rows: list[dict]) -> None:
    print("\nprocess (after the warm start and after each iteration; s = the iteration's wall time)")
    print(PROCESS_HEADER)
    for row in rows:
        print(process_line(row))
    print("\nworkspace disk, KiB allocated (du; a hard link counted once, in the first column holding it); "
          "growth = total - previous row; batch = data/batch, batch new = its bytes the DVC cache did not hold "
          "at the previous row, model = data/models/candidate; "
          "prefect = PREFECT_HOME, tmp = TMPDIR (outside the workspace)")
    print(DISK_HEADER)
    for i, row in enumerate(rows):
        print(disk_line(row, rows[i - 1] if i else None))
    if rows:
        last = rows[-1]
        print(f"\nlive descendants after {label(last)}: " + ("; ".join(last["child_cmdlines"]) or "none"))
        print("leftover processes: " + ("; ".join(last["leftover_cmdlines"]) or "none"))
        print(f"TMPDIR entries after {label(last)}: " + (", ".join(last["tmp_entries"][:8]) or "none")
              + (f", … ({len(last['tmp_entries'])} in all)" if len(last["tmp_entries"]) > 8 else ""))
    print()
    for line in verdicts(rows):
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10, help="iterations after the warm start (default: 10)")
    parser.add_argument("--workspace", type=Path, help="make (and keep) the workspace here; it must not exist "
                        "or be empty (default: a temp dir removed at the end)")
    parser.add_argument("--json", type=Path, help="also write every row as JSON")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="closedloop-soak-")).resolve()
    if args.workspace:
        root = args.workspace.resolve()
        if root.exists() and any(root.iterdir()):
            raise SystemExit(f"soak: {root} is not empty")
    else:
        root = scratch / "ws"
    root.mkdir(parents=True, exist_ok=True)
    setup_env(scratch)
    # Registered before prefect is imported, so it runs after prefect's own exit hooks stop the server.
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # the workspace too, unless --workspace

    import psutil
    import yaml

    from closedloop.scaffold import init_workspace

    started = time.time() - 1.0
    me = psutil.Process()
    rows: list[dict] = []
    cache_before: set[tuple[int, int]] = set()
    print(f"soak: workspace {root}; scratch (PREFECT_HOME, TMPDIR) {scratch}; {args.iterations} iterations",
          flush=True)
    try:
        (root / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
        init_workspace(root)
        from flows.iteration import iteration_flow
        from flows.loop import warm_start_flow

        t = time.perf_counter()
        warm_start_flow(workspace=str(root), progress=False)
        rows.append({"iteration": 0, "seconds": time.perf_counter() - t,
                     **measure(me, root, scratch, started, cache_before)})
        print(PROCESS_HEADER, flush=True)
        print(process_line(rows[-1]), flush=True)
        for i in range(1, args.iterations + 1):
            t = time.perf_counter()
            iteration_flow(workspace=str(root), progress=False)
            rows.append({"iteration": i, "seconds": time.perf_counter() - t,
                         **measure(me, root, scratch, started, cache_before)})
            print(process_line(rows[-1]) + f"   disk total {kib(rows[-1]['disk']['total'])} KiB", flush=True)
    finally:
        report(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        time.sleep(1.0)  # as the CLI's _drain: let the ephemeral API finish writing the last events


if __name__ == "__main__":
    main()
