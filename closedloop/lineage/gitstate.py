"""The git plumbing under DVC experiments: running git, and undoing what a killed `dvc exp save` left.

Split out of lineage/dvc/ (which drives DVC itself and calls these): nothing here imports DVC.
``record_git_state`` is what ``DvcWorkspace.exp_save`` writes before each save; the restore
functions put HEAD, the files, the index and `git stash` back from that record
(``DvcWorkspace.clean_interrupted_git_state`` says what a killed save leaves and when each applies).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class DvcError(RuntimeError):
    """A DVC operation, or the git plumbing under it, failed; the message names the workspace."""


# -- after a killed `dvc exp save` ---------------------------------------------------------------
def record_git_state(root: Path, keep: list[str]) -> dict[str, Any]:
    """What clean_interrupted_git_state needs to put the git state back as it was before a save: HEAD,
    the top of `git stash`, the index (as a tree) and the files (a tree of the tracked files and of
    ``keep``, the untracked files the save includes, as they are now)."""
    return {
        "head_ref": git_try(root, "symbolic-ref", "-q", "HEAD"),  # None: HEAD was detached
        "head": git_try(root, "rev-parse", "-q", "--verify", "HEAD"),
        "stash": git_try(root, "rev-parse", "-q", "--verify", "refs/stash"),
        "index": git_try(root, "write-tree"),  # None with unmerged paths: the index is then left as it is
        "files": _snapshot(root, keep),
        "pid": None,
        "started": time.time(),
    }


def _scratch_index(root: Path) -> dict[str, str]:
    """git's environment with an index of our own, so the user's index is never touched."""
    return {**git_identity_env(root), "GIT_INDEX_FILE": str(root / ".dvc" / "tmp" / "closedloop-scratch.index")}


def _snapshot(root: Path, keep: list[str]) -> str | None:
    """A git tree of the tracked files and ``keep`` as they are in the workspace, written to git's
    object store through a scratch index (a copy of the real one, for its stat cache: unchanged files
    are not hashed again). A few ms for a workspace's small git-tracked files."""
    env = _scratch_index(root)
    scratch = Path(env["GIT_INDEX_FILE"])
    real = root / git(root, "rev-parse", "--git-path", "index").strip()
    try:
        if real.exists():
            shutil.copyfile(real, scratch)
        steps = [["add", "-u", "--", "."]] + ([["add", "-f", "--", *keep]] if keep else []) + [["write-tree"]]
        for step in steps:
            result = subprocess.run(["git", *step], cwd=root, env=env, capture_output=True, text=True)
            if result.returncode:
                return None
        return result.stdout.strip()
    finally:
        scratch.unlink(missing_ok=True)


def restore_git_state(root: Path, record: dict[str, Any] | None) -> list[str]:
    """HEAD, the files and the index as ``record`` says they were before the save, and `git stash`
    without the entries the save pushed."""
    head_ref = git_try(root, "symbolic-ref", "-q", "HEAD")
    head = git_try(root, "rev-parse", "-q", "--verify", "HEAD")
    if head is None:
        return []  # no commit yet: no save can have begun
    if record is None or not record.get("head"):
        if head_ref is None:
            branch = reflog_branch(root)
            raise DvcError(
                f"{root}: HEAD is detached at {head[:7]} and DVC's refs show a `dvc exp save` that was killed "
                "midway, one closedloop has no record of. Put it back by hand: `git checkout "
                f"{branch or '<your branch>'}`, then, if `git stash list` shows a 'WIP on' entry that save made, "
                "`git stash pop --index`; then run again")
        return []
    done: list[str] = []
    before = record["head"]
    if head_ref is None:
        if record.get("head_ref"):
            tip = git_try(root, "rev-parse", "-q", "--verify", record["head_ref"])
            if tip != before:
                raise DvcError(f"{root}: HEAD is detached at {head[:7]} after a killed `dvc exp save`, and "
                               f"{record['head_ref']} has moved since ({before[:7]} → {str(tip)[:7]}): "
                               f"check out the branch you want by hand, then run again")
            git(root, "symbolic-ref", "-m", "closedloop: HEAD back after a killed dvc exp save", "HEAD",
                 record["head_ref"])
            done.append(f"reattached HEAD to {record['head_ref'].removeprefix('refs/heads/')} "
                        f"(the save left it detached at {head[:7]})")
        elif head != before:
            git(root, "update-ref", "--no-deref", "HEAD", before)
            done.append(f"moved the detached HEAD back to {before[:7]} (the save left it at {head[:7]})")
    if git(root, "rev-parse", "HEAD").strip() != before:
        return done  # someone committed since: the recorded files and index no longer apply
    # The one entry the save pushed onto `git stash`: DVC's stash of the workspace ("WIP on <branch>"),
    # or scmrepo's temporary copy of EXEC_MERGE ("dvc-exp:...", it applies a stash commit that way).
    # The files come back from the record below, so the entry is a copy: dropped.
    top = git_try(root, "rev-parse", "-q", "--verify", "refs/stash")
    if (top and top != record.get("stash")
            and git_try(root, "rev-parse", "-q", "--verify", "refs/stash@{1}") == record.get("stash")
            and git_try(root, "rev-parse", f"{top}^1") == before):
        message = git(root, "log", "-1", "--format=%s", top).strip()
        if message.startswith(("WIP on ", "dvc-exp:")):
            git(root, "stash", "drop", "-q")
            done.append(f"dropped the git stash entry the save made ({message!r}; its files are put back from "
                        "closedloop's record)")
    if record.get("files"):
        done += _restore_files(root, record["files"], before)
    index = record.get("index") or before
    if git_try(root, "write-tree") != index:
        git(root, "read-tree", index)
        done.append("restored the index (what was staged) as it was before the save")
    git_try(root, "update-index", "-q", "--refresh")
    return done


def _restore_files(root: Path, files: str, head: str) -> list[str]:
    """The workspace's tracked files (and the untracked ones the save included) as the tree ``files``
    holds them: the save may have reset them, stashed them or been killed while writing one."""
    env = _scratch_index(root)
    scratch = Path(env["GIT_INDEX_FILE"])

    def git(*args: str, check: bool = True) -> str:
        result = subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True)
        if check and result.returncode:
            raise DvcError(f"git {' '.join(args)} failed in {root}: {result.stderr.strip()}")
        return result.stdout

    done = []
    try:
        git("read-tree", files)
        git("update-index", "-q", "--refresh", check=False)  # stat the files; what differs stays listed
        differ = [name for name in git("diff-files", "--name-only", "--relative", "-z").split("\0") if name]
        if differ:
            git("checkout-index", "-f", "--", *differ)
            done.append(f"put back {', '.join(differ)} as before the save (it had reset, stashed or cut them short)")
        gone = [name for name in git("diff", "--name-only", "--relative", "-z", "--diff-filter=D", head, files)
                .split("\0") if name and (root / name).exists()]
        for name in gone:
            (root / name).unlink()
        if gone:
            done.append(f"removed {', '.join(gone)} again (deleted before the save; the save had brought them back)")
    finally:
        scratch.unlink(missing_ok=True)
    return done


def remove_stale_git_locks(root: Path, since: float | None) -> list[str]:
    """The ``*.lock`` files a killed git writer leaves (a ref, the index, HEAD: git and DVC then fail
    with "File exists" until they go). With a record of the killed save, those made since it started
    go; without one, only those in DVC's own refs/exps/, and only once a minute old."""
    gitdir = Path(git(root, "rev-parse", "--absolute-git-dir").strip())
    # A ref's reflog has a lock of its own (`git stash drop` rewrites logs/refs/stash under
    # logs/refs/stash.lock): a save killed while scmrepo pushed or dropped its stash entry leaves it.
    locks = [gitdir / name for name in ("index.lock", "HEAD.lock", "packed-refs.lock", "refs/stash.lock",
                                        "logs/HEAD.lock", "logs/refs/stash.lock")]
    locks += sorted((gitdir / "refs" / "exps").rglob("*.lock"))
    locks += sorted((gitdir / "logs" / "refs" / "exps").rglob("*.lock"))
    done = []
    for lock in locks:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            continue
        dvcs = lock.is_relative_to(gitdir / "refs" / "exps") or lock.is_relative_to(gitdir / "logs" / "refs" / "exps")
        if (since is not None and lock.stat().st_mtime >= since - 1.0) or (since is None and dvcs and age > 60):
            lock.unlink(missing_ok=True)
            done.append(f"removed {lock.relative_to(gitdir.parent) if gitdir.parent in lock.parents else lock} "
                        f"(a git lock file the killed process left, {age:.0f} s old)")
    return done


def reflog_branch(root: Path) -> str | None:
    """The branch the last `checkout: moving from <branch> to ...` left, for a hint."""
    import re

    for line in (git_try(root, "log", "-g", "-n", "50", "--format=%gs", "HEAD") or "").splitlines():
        match = re.match(r"checkout: moving from (\S+) to ", line)
        if match:
            return match.group(1)
    return None


def wait_for_exit(pid: int, root: Path, timeout_s: float = 120.0) -> list[str]:
    """A `dvc exp save` whose parent was killed runs on; let it end before anything is cleaned."""
    import psutil

    started = time.monotonic()
    try:
        process = psutil.Process(pid)
        if "dvc" not in " ".join(process.cmdline()):
            return []  # the pid now belongs to another program: the save is long gone
        process.wait(timeout=timeout_s)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    except psutil.TimeoutExpired:
        raise DvcError(f"{root}: a `dvc exp save` (pid {pid}) started by an earlier run is still running after "
                       f"{timeout_s:.0f} s; wait for it to end (or end it), then run again") from None
    return [f"waited {time.monotonic() - started:.1f} s for the `dvc exp save` (pid {pid}) a killed run left "
            "running to end"]


def write_record(path: Path, data: Any) -> None:
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(data))
    os.replace(staging, path)


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def git(root: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=git_identity_env(root))
    if result.returncode:
        raise DvcError(f"git {' '.join(args)} failed in {root}: {result.stderr.strip()}")
    return result.stdout


def git_try(root: Path, *args: str, strip: bool = True) -> str | None:
    """git's output, or None where it fails (a ref that does not exist, a path not at that commit)."""
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=git_identity_env(root))
    if result.returncode:
        return None
    return result.stdout.strip() if strip else result.stdout


def inside_git(root: Path) -> bool:
    return subprocess.run(["git", "rev-parse", "--git-dir"], cwd=root, capture_output=True).returncode == 0


def git_toplevel(root: Path) -> Path:
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    return Path(out.stdout.strip()).resolve()


def git_identity_env(root: Path) -> dict[str, str]:
    """Experiment commits need an identity; fresh machines and CI often have none (STACK_NOTES).
    Use the user's when set, a neutral one otherwise — never written into their git config.
    The interpreter's bin directory leads PATH so `dvc repro` finds this `closedloop`."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Each `dvc` command would otherwise start a detached analytics daemon that posts to dvc.org (no
    # network here) and leaves a file in the temp directory (benchmarks/soak.py counted one per iteration).
    env.setdefault("DVC_NO_ANALYTICS", "1")
    probe = subprocess.run(["git", "config", "user.email"], cwd=root, capture_output=True, text=True)
    if not probe.stdout.strip():
        for role in ("AUTHOR", "COMMITTER"):
            env.setdefault(f"GIT_{role}_NAME", "closedloop")
            env.setdefault(f"GIT_{role}_EMAIL", "closedloop@localhost")
    return env
