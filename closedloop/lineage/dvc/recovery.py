"""Crash recovery: undoing what a `dvc exp save` killed midway left in the git state and in DVC's
lock files, so that the next save starts from the state the last one came from."""

from __future__ import annotations

from pathlib import Path

from closedloop.lineage.dvc.experiments import EXP_SAVE_RECORD
from closedloop.lineage.dvc.repository import Repository
from closedloop.lineage.gitstate import (
    git,
    git_try,
    inside_git,
    read_record,
    remove_stale_git_locks,
    restore_git_state,
    wait_for_exit,
    write_record,
)

# The refs DVC's experiment executor sets while it saves and removes when it ends (EXEC_HEAD it
# leaves behind even then; EXEC_APPLY belongs to `dvc exp apply` and is not ours to touch).
EXEC_REFS = ("EXEC_HEAD", "EXEC_MERGE", "EXEC_BASELINE", "EXEC_BRANCH")
EXEC_NAMESPACE = "refs/exps/exec"
WORKSPACE_QUEUE = "refs/exps/stash"  # DVC's workspace queue: an entry lives for the length of one save
REPRO_ARGS = ".dvc/tmp/repro.dat"  # DVC's packed arguments, `git add -f`-ed while a save runs


def clean_interrupted_git_state(repository: Repository) -> list[str]:
    """Undo what a `dvc exp save` killed midway left in the git state; one line for each thing
    done (for a warning). Run it before a run starts its work, holding the run's lock.

    What a killed save leaves, by where it was killed (real saves SIGKILLed at each step; see
    tests/unit/test_dvc_workspace.py): HEAD detached (at the baseline, or at the half-saved
    experiment's commit); the workspace's tracked files reset to the last commit, their changes
    in a `git stash` entry ("WIP on <branch>", or scmrepo's "dvc-exp:..." copy of EXEC_MERGE) or
    only in refs/exps/exec/EXEC_MERGE, or a file cut short mid-write (an empty params.yaml): the
    next save would record that; ``.dvc/tmp/repro.dat`` and the files being saved staged in the
    index; refs/exps/exec/EXEC_*; an entry in DVC's workspace queue refs/exps/stash; a git lock
    file (``refs/exps/.../<name>.lock``: every later save fails "File exists"); DVC's
    .dvc/tmp/exps/rwlock left empty (every later save fails "JSON structure is corrupted") or
    naming the dead process (DVC drops such an entry itself, with a warning, unless the pid now
    belongs to another process: then it says "is busy"). DVC's repository lock (.dvc/tmp/lock)
    is an flock, released when its process dies: it blocks nothing.

    exp_save records HEAD, `git stash`, the index and a tree of the files before each save; with
    that record HEAD, the files (tracked ones and the untracked ones the save included) and the
    index come back exactly, the stash entry the save pushed is dropped. Without one (a save
    closedloop did not start) only DVC's refs, queue entry, repro.dat, lock files and rwlock
    entries go, and a detached HEAD is a DvcError that says what to do. Never touched:
    experiment refs (refs/exps/<baseline>/<name>), EXEC_APPLY (`dvc exp apply`), queued
    experiments (refs/exps/celery), other stash entries, what the user staged. Nothing is done
    without a sign that a save was interrupted (a completed save leaves EXEC_HEAD and repro.dat
    on disk: those are DVC's normal state). ~15 ms when there is nothing to do."""
    root = repository.root
    if not inside_git(root):
        return []
    with repository.locked():
        record_path = root / EXP_SAVE_RECORD
        record = read_record(record_path)
        waited = wait_for_exit(int(record["pid"]), root) if record and record.get("pid") else []
        done = remove_stale_git_locks(root, record.get("started") if record else None)
        locks = bool(done)
        done = waited + done + release_dead_rwlocks(root)
        exec_refs = [ref for ref in git(root, "for-each-ref", "--format=%(refname)", EXEC_NAMESPACE).split()
                     if ref.rsplit("/", 1)[-1] in EXEC_REFS]
        queued = git_try(root, "rev-parse", "-q", "--verify", WORKSPACE_QUEUE)
        staged_args = bool(git_try(root, "ls-files", "--", REPRO_ARGS))
        midway = {"EXEC_MERGE", "EXEC_BASELINE", "EXEC_BRANCH"} & {ref.rsplit("/", 1)[-1] for ref in exec_refs}
        detached = git_try(root, "symbolic-ref", "-q", "HEAD") is None
        stash = git_try(root, "rev-parse", "-q", "--verify", "refs/stash")
        stashed = bool(record) and stash != record.get("stash")
        if locks or staged_args or queued or midway or stashed or (detached and record):
            done += restore_git_state(root, record)
            done += _drop_dvc_save_state(root, exec_refs, queued)
        record_path.unlink(missing_ok=True)
        return done


def _drop_dvc_save_state(root: Path, exec_refs: list[str], queued: str | None) -> list[str]:
    """What DVC's executor left of an interrupted save once the git state is back: repro.dat staged,
    its EXEC_* refs and its entry in the workspace queue. Caller holds the lock."""
    done: list[str] = []
    if git_try(root, "ls-files", "--", REPRO_ARGS):
        git(root, "rm", "--cached", "-q", "--", REPRO_ARGS)
        done.append(f"unstaged {REPRO_ARGS} (DVC's packed arguments, not part of the workspace)")
    for ref in exec_refs:
        git(root, "update-ref", "--no-deref", "-d", ref)  # EXEC_BRANCH is symbolic: not its target
        done.append(f"removed ref {ref}")
    if queued:
        entries = len(git(root, "log", "-g", "--format=%H", WORKSPACE_QUEUE).split())
        git(root, "update-ref", "-d", WORKSPACE_QUEUE)
        done.append(f"dropped {WORKSPACE_QUEUE} (DVC's workspace queue: {entries} entr"
                    f"{'y' if entries == 1 else 'ies'} of saves that never ran)")
    return done


def release_dead_rwlocks(root: Path) -> list[str]:
    """DVC's rwlock files (.dvc/tmp/rwlock, .dvc/tmp/exps/rwlock) as a killed DVC leaves them: entries
    of a process that is gone, or whose pid now belongs to a process started after the file was last
    written (a pid used again, as in a fresh container: DVC would say "is busy"), are dropped; a file
    left empty or cut short (killed while DVC rewrote it: DVC then refuses every command it guards,
    "JSON structure is corrupted") is reset to no locks: whatever it held was lost with the write."""
    import psutil
    from dvc.config import Config
    from dvc.fs import localfs
    from dvc.lock import make_lock
    from dvc.rwlock import RWLOCK_LOCK, RWLockFileCorruptedError, RWLockFileFormatError, _edit_rwlock

    hardlink = bool(Config(dvc_dir=str(root / ".dvc"), validate=False).get("core", {}).get("hardlink_lock", False))
    done: list[str] = []

    def gone(info: dict, written: float) -> bool:
        try:
            return psutil.Process(int(info["pid"])).create_time() > written + 1.0
        except (psutil.NoSuchProcess, ValueError, KeyError):
            return True
        except psutil.AccessDenied:
            return False

    for lock_dir in (root / ".dvc" / "tmp", root / ".dvc" / "tmp" / "exps"):
        path = lock_dir / "rwlock"
        if not path.is_file():
            continue
        written = path.stat().st_mtime
        try:
            with _edit_rwlock(str(lock_dir), localfs, hardlink) as lock:
                for mode in ("read", "write"):
                    for target, infos in list(lock[mode].items()):
                        listed = infos if isinstance(infos, list) else [infos]
                        dead = [info for info in listed if gone(info, written)]
                        for info in dead:
                            cmd = str(info.get("cmd", "?"))
                            cmd = cmd if len(cmd) <= 60 else cmd[:57] + "..."
                            done.append(f"removed the {mode} lock on {target} held by process {info.get('pid')} "
                                        f"(no longer running: {cmd}) from {path.relative_to(root)}")
                        alive = [info for info in listed if info not in dead]
                        if not alive:
                            del lock[mode][target]
                        elif mode == "read":
                            lock[mode][target] = alive
        except (RWLockFileCorruptedError, RWLockFileFormatError):
            with make_lock(str(lock_dir / RWLOCK_LOCK), tmp_dir=str(lock_dir), hardlink_lock=hardlink):
                size = path.stat().st_size
                write_record(path, {"read": {}, "write": {}})
            done.append(f"reset {path.relative_to(root)}: a process killed while writing it left it unreadable "
                        f"({size} bytes), and DVC refuses the commands it guards until then")
    return done
