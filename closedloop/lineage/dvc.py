"""The only module that drives DVC (and the git plumbing DVC experiments need).

Every operation takes one workspace-wide file lock: DVC holds a repository lock of its own, but
``gc``, ``checkout`` and ``push`` are not blocked by a running ``repro`` and can corrupt it, so we
serialise all of them here (STACK_NOTES).

Links, not copies. DVC copies every cached file into the workspace by default, so a model folder
lived twice (workspace + ``.dvc/cache``) before the remote and MLflow added theirs. A workspace
gets a ``cache.type`` that links where its file system allows (:func:`link_cache_type`): then a
tracked file in the workspace *is* the cache object (a hardlink to it, or a symlink), read-only.
Writing such a file in place would change the cached bytes of every version that shares them, and
DVC trusts a read-only cache object without hashing it again (it would push and check out the
corrupted bytes under the old hash), so nothing in closedloop ever does: every writer writes a new file or directory and renames it over
the old one (``closedloop.io``: ``write_json``/``write_jsonl``/``replace_dir``; the warmstart and
train stages save into ``*.staging`` and rename; validate deletes its folder first), and DVC itself
removes a link before it checks out another. Being root does not make a read-only link writable
by accident here: nobody opens one for writing.

No working directory. Prefect runs tasks in threads, and the working directory belongs to the whole
process, so nothing here changes it: DVC's in-process API gets absolute targets
(``<root>/dvc.yaml:<stage>``, absolute paths), subprocesses get ``cwd=``, and what DVC reports
relative to the process's cwd (``status`` keys) is turned back into workspace-relative names.

Integrity. DVC trusts a read-only cache object without hashing it again, so a corrupted object is
read, pushed and checked out under its old hash. :meth:`DvcWorkspace.read_at` hashes what it reads
and fetches a bad object again from the default remote (whose copy it hashes first);
closedloop.lineage.preflight checks what an iteration will read before its first stage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from closedloop.lineage.gitstate import (  # noqa: F401  (re-exported: callers import them from here)
    DvcError,
)
from closedloop.lineage.gitstate import (
    git as _git,
)
from closedloop.lineage.gitstate import (
    git_identity_env as _git_identity_env,
)
from closedloop.lineage.gitstate import (
    git_toplevel as _git_toplevel,
)
from closedloop.lineage.gitstate import (
    git_try as _git_try,
)
from closedloop.lineage.gitstate import (
    inside_git as _inside_git,
)
from closedloop.lineage.gitstate import (
    read_record as _read_json,
)
from closedloop.lineage.gitstate import (
    record_git_state as _git_state,
)
from closedloop.lineage.gitstate import (
    remove_stale_git_locks as _remove_stale_git_locks,
)
from closedloop.lineage.gitstate import (
    restore_git_state as _restore_git_state,
)
from closedloop.lineage.gitstate import (
    wait_for_exit as _wait_for_exit,
)
from closedloop.lineage.gitstate import (
    write_record as _write_json,
)

DEFAULT_REMOTE = "local"
# <workspace>/.dvc-remote, stored relative to .dvc/ (as "../.dvc-remote") so the workspace can move
# and keep its remote.
DEFAULT_REMOTE_URL = ".dvc-remote"
# What exp_save records before it runs `dvc exp save` (HEAD, the stash, the index, the files) and deletes
# once that process has ended: found by clean_interrupted_git_state, it says a save was killed midway
# and what the git state was before it.
EXP_SAVE_RECORD = ".dvc/tmp/closedloop-exp-save.json"
# The refs DVC's experiment executor sets while it saves and removes when it ends (EXEC_HEAD it
# leaves behind even then; EXEC_APPLY belongs to `dvc exp apply` and is not ours to touch).
EXEC_REFS = ("EXEC_HEAD", "EXEC_MERGE", "EXEC_BASELINE", "EXEC_BRANCH")
EXEC_NAMESPACE = "refs/exps/exec"
WORKSPACE_QUEUE = "refs/exps/stash"  # DVC's workspace queue: an entry lives for the length of one save
REPRO_ARGS = ".dvc/tmp/repro.dat"  # DVC's packed arguments, `git add -f`-ed while a save runs
# What closedloop sets where nobody set cache.type, by what the workspace's file system can do:
# - reflink (btrfs, XFS, APFS): copy-on-write clones, DVC's own default; a write makes a new copy.
# - hardlink: no "copy" fallback after it, on purpose. With "copy" in the list DVC accepts any plain
#   file as correctly checked out and never relinks it (dvc_data ``_needs_relink``), so a model
#   written again with bytes the cache already holds would stay a second full copy; without it,
#   ``add``/``commit`` replace such a file by a link to the cached object.
# - symlink: the cache lives on another file system.
LINK_CACHE_TYPES = {"reflink": "reflink,copy", "hardlink": "hardlink,symlink", "symlink": "symlink"}


logger = logging.getLogger(__name__)


# How the loop names the experiment of an iteration: its number, then its candidate's fingerprint.
ITERATION_EXPERIMENT = re.compile(r"iter-(\d+)-[0-9a-f]+")


class DvcWorkspace:
    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()

    # -- locking -------------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the workspace lock: one DVC operation at a time, across threads and processes. It is
        re-entrant within a thread (one lock object per lock file in this process), so an operation
        may call another. The process's working directory is left alone (see the module docstring)."""
        from filelock import FileLock

        lock_dir = self.root / ".dvc" / "tmp"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_dir / "closedloop.lock"), timeout=600, is_singleton=True):
            yield

    def _stage_target(self, stage: str) -> str:
        # DVC resolves a bare stage name against dvc.yaml of the process's cwd: name the file.
        return f"{self.root / 'dvc.yaml'}:{stage}"

    def _abs(self, path: str | Path) -> Path:
        return Path(path) if Path(path).is_absolute() else self.root / path

    def _repo(self):
        from dvc.repo import Repo

        # "Updating lock file" and "To track the changes with git, run: ..." (DVC logs both at INFO)
        # on every stage is noise: the loop saves git state itself, as DVC experiments.
        logging.getLogger("dvc").setLevel(logging.WARNING)

        repo = Repo(str(self.root))
        repo.stage_cache = _run_cache(repo)
        return repo

    # -- setup ---------------------------------------------------------------------------------
    def init(self) -> None:
        """Make the workspace a git + DVC repository with a local default remote and a linking cache,
        whatever of that it lacks. Idempotent: run on an existing workspace it only adds what is
        missing (a workspace made before caches linked gets its cache.type, and its tracked outputs
        that are still plain copies become links)."""
        if not _inside_git(self.root):
            _git(self.root, "init", "-q")
        if not (self.root / ".dvc").exists():
            from dvc.repo import Repo

            Repo.init(str(self.root), subdir=_git_toplevel(self.root) != self.root)
        with self.locked():
            from dvc.config_schema import RelPath

            repo = self._repo()
            try:
                with repo.config.edit() as config:
                    remotes = config.setdefault("remote", {})
                    if not remotes:
                        # RelPath: DVC stores it relative to .dvc/ (a plain absolute path stays absolute)
                        remotes[DEFAULT_REMOTE] = {"url": RelPath(str(self.root / DEFAULT_REMOTE_URL))}
                        config.setdefault("core", {})["remote"] = DEFAULT_REMOTE
            finally:
                repo.close()
            self._ensure_cache_type()
            self._relink_outputs()

    def cache_type(self) -> str:
        """The cache.type DVC uses here, as configured at any level; "" where none is set (then DVC
        uses its default, "reflink,copy")."""
        return _configured_cache_type(self.root)

    def _ensure_cache_type(self) -> None:
        """Set cache.type where no level of DVC's config sets it, chosen by a probe of the links this
        file system supports. Written to .dvc/config.local: it describes this machine's file system,
        not the project (a clone elsewhere probes its own). Cheap once set. Caller holds the lock."""
        if _configured_cache_type(self.root):
            return  # the user's (or an earlier init's) choice stands
        repo = self._repo()
        try:
            chosen = link_cache_type(repo)
            with repo.config.edit("local") as config:
                config.setdefault("cache", {})["type"] = chosen
        finally:
            repo.close()

    def _relink_outputs(self) -> None:
        """Replace tracked outputs that are plain copies of their cached objects by links (what
        `dvc checkout --relink` does), skipping any output that differs from what DVC recorded or
        whose object is not in the cache: this never overwrites or deletes a user's bytes.
        Caller holds the lock."""
        from dvc.exceptions import DvcException

        repo = self._repo()
        try:
            if _configured_cache_type(self.root).split(",")[0] not in ("hardlink", "symlink"):
                return  # reflink and copy workspaces have nothing to relink
            for stage in repo.index.stages:
                for out in stage.outs:
                    if not out.use_cache or not out.hash_info or not out.exists:
                        continue
                    try:
                        if out.changed_checksum() or out.changed_cache():
                            continue
                        out.checkout(relink=True)
                    except DvcException:
                        continue
        finally:
            repo.close()

    # -- recording stages and inputs -----------------------------------------------------------
    def commit(self, stage: str) -> None:
        """Record a stage that just ran in-process in dvc.lock and the cache, as `dvc repro` would."""
        with self.locked():
            self._ensure_cache_type()
            repo = self._repo()
            try:
                repo.commit(self._stage_target(stage), force=True)
            finally:
                repo.close()

    def add(self, *paths: str) -> None:
        with self.locked():
            self._ensure_cache_type()  # a workspace made before caches linked gets links from now on
            repo = self._repo()
            try:
                repo.add([str(self._abs(path)) for path in paths])
            finally:
                repo.close()

    def push(self) -> int:
        with self.locked():
            repo = self._repo()
            try:
                return repo.push()
            finally:
                repo.close()

    def status(self) -> dict:
        """`dvc status`: each changed stage (by name; ``<file>:<name>`` or the ``.dvc`` file's path,
        relative to the workspace, for stages elsewhere) with what changed; {} when all is recorded."""
        with self.locked():
            repo = self._repo()
            try:
                return {self._status_key(key): value for key, value in repo.status().items()}
            finally:
                repo.close()

    def _status_key(self, key: str) -> str:
        """DVC names a stage relative to the process's cwd ("../ws/dvc.yaml:train", "../ws/data/x.dvc";
        the bare name in the workspace itself): name it as `dvc status` run in the workspace would."""
        file, _, name = key.rpartition(":")
        if file.endswith("dvc.yaml"):
            relative = os.path.relpath(os.path.abspath(file), self.root)
            return name if relative == "dvc.yaml" else f"{relative}:{name}"
        if key.endswith(".dvc"):
            return os.path.relpath(os.path.abspath(key), self.root)
        return key  # a stage of the workspace's dvc.yaml, named from the workspace

    def stage_up_to_date(self, name: str) -> bool:
        """True when dvc.lock records stage ``name`` and its deps, params and outs all match the
        workspace: an empty `dvc status <name>` (DVC's own check of that stage alone, not of the
        stages before it). False when dvc.lock has no record of it, anything changed, or an output is
        missing. Costs a DVC repo open, DVC's parse of dvc.yaml and dvc.lock and the hashing its state
        database cannot skip: 0.15–0.25 s on a tiny workspace with ruamel.yaml.clib installed (DVC
        parses YAML with ruamel), 0.4–1 s without; 20 ms for a stage dvc.lock does not record."""
        if name not in self._lock_stages():
            return False
        from dvc.stage.exceptions import StageNotFound

        with self.locked():
            repo = self._repo()
            try:
                return not repo.status(targets=[self._stage_target(name)])
            except StageNotFound:
                return False
            finally:
                repo.close()

    # -- model versions by reference: the registry points at DVC's bytes, it does not copy them -----
    def reference(self, path: str) -> dict[str, Any]:
        """What names the bytes DVC recorded for the tracked ``path`` (relative to the workspace) and
        where to get them back: its hash (md5, size, nfiles; from dvc.lock or its .dvc file), the
        workspace and default remote holding the objects, the git commit, and ``dvc_file``: a DVC
        pointer file (the text of a ``.dvc`` file) for that hash. :meth:`restore` and ``dvc pull``
        turn it back into the directory."""
        out = self.recorded_out(path)
        if out is None:
            raise DvcError(f"{path} is not a DVC-tracked output of {self.root} (not in dvc.lock or a .dvc file)")
        fields = {"md5": out["md5"], "size": out.get("size"), "nfiles": out.get("nfiles"),
                  "hash": out.get("hash", "md5")}
        return {"path": path, **fields, "workspace": str(self.root), "remote": self.remote_url(),
                "git_rev": self.head_rev(), "dvc_file": pointer_file(fields, Path(path).name)}

    def remote_url(self) -> str:
        """The default remote's URL as an absolute path (local remotes) or as configured; "" if none."""
        from dvc.config import Config

        config = Config(dvc_dir=str(self.root / ".dvc"), validate=False)
        name = config.get("core", {}).get("remote")
        url = config.get("remote", {}).get(name, {}).get("url", "") if name else ""
        if url and "://" not in url and not os.path.isabs(url):
            url = os.path.normpath(self.root / ".dvc" / url)  # DVC stores local remotes relative to .dvc/
        return url

    def restore(self, reference: dict[str, Any] | str, dest: str | Path) -> Path:
        """Bring back the directory (or file) that ``reference`` names — a dict from :meth:`reference`
        or a bare md5 such as ``"3f…e1.dir"`` — as ``dest`` inside this workspace, from the cache or,
        where the cache lacks it, the default remote (``dvc pull`` of a pointer file). The files are
        checked out the way the cache links: read-only links to the cached objects; copy them before
        changing them. Returns ``dest`` as an absolute path."""
        fields = {"md5": reference} if isinstance(reference, str) else dict(reference)
        dest = (self.root / dest).resolve() if not Path(dest).is_absolute() else Path(dest).resolve()
        if not dest.is_relative_to(self.root):
            raise DvcError(f"restore: {dest} is not inside the workspace {self.root}; DVC checks out only there")
        if dest.exists():
            raise DvcError(f"restore: {dest} exists already")
        dest.parent.mkdir(parents=True, exist_ok=True)
        pointer = dest.with_name(dest.name + ".dvc")
        pointer.write_text(pointer_file(fields, dest.name))
        try:
            with self.locked():
                repo = self._repo()
                try:
                    repo.pull(targets=[str(pointer)])
                finally:
                    repo.close()
        except Exception as error:
            raise DvcError(f"restore of {fields['md5']} into {dest} failed: {error}") from error
        finally:
            pointer.unlink(missing_ok=True)  # the pointer is a means: left behind it would be tracked state
        return dest

    def recorded_out(self, path: str, version: str | None = None) -> dict[str, Any] | None:
        """What DVC recorded for the tracked ``path`` (relative to the workspace): the output's fields
        (md5, size, nfiles, hash) from dvc.lock or ``<path>.dvc``, in the workspace or, given
        ``version``, as that experiment saved them. None where neither records it."""
        found = self.locate(path, version)
        return found[0] if found and not found[1] else None

    def locate(self, path: str, version: str | None = None) -> tuple[dict[str, Any], str] | None:
        """The output that records ``path`` and where ``path`` lies inside it ("" for the output
        itself, a relative path for a file of a directory output)."""
        if version is None:
            def read(relative: str) -> str | None:
                file = self.root / relative
                return file.read_text() if file.is_file() else None
        else:
            rev = self.experiment_rev(version)

            def read(relative: str) -> str | None:
                # "<rev>:./<path>" is relative to the cwd given to git: the workspace, even as a subdir
                return _git_try(self.root, "show", f"{rev}:./{relative}", strip=False)

        def match(candidates) -> tuple[dict[str, Any], str] | None:
            for out_path, out in candidates:
                if path == out_path:
                    return out, ""
                if path.startswith(out_path.rstrip("/") + "/"):
                    return out, path[len(out_path.rstrip("/")) + 1:]
            return None

        if version is None:
            stages = self._lock_stages().values()
        else:
            lock = read("dvc.lock")
            stages = ((_load_yaml(lock) or {}).get("stages") or {}).values() if lock else ()
        found = match((out["path"], out) for stage in stages for out in stage.get("outs", []))
        parts = Path(path).parts
        for depth in range(len(parts), 0, -1):  # <path>.dvc, then the .dvc files of its parent folders
            if found:
                break
            tracked = "/".join(parts[:depth])
            text = read(tracked + ".dvc")
            outs = (_load_yaml(text) or {}).get("outs", []) if text else []
            found = match((str(Path(tracked).parent / out["path"]).removeprefix("./"), out) for out in outs)
        return found

    # -- the objects behind the records: DVC's cache and the default remote -----------------------
    def cache_path(self, md5: str) -> Path:
        """Where the cache holds the object ``md5`` (a file's hash, or ``<hash>.dir`` for a
        directory's listing), whether or not it is there."""
        if not hasattr(self, "_cache_dir"):
            from dvc.config import Config

            configured = Config(dvc_dir=str(self.root / ".dvc"), validate=False).get("cache", {}).get("dir")
            self._cache_dir = (self.root / ".dvc" / configured) if configured else self.root / ".dvc" / "cache"
        return self._cache_dir / "files" / "md5" / md5[:2] / md5[2:]

    def dir_entries(self, md5: str) -> dict[str, str]:
        """The files of the directory object ``md5`` (``<hash>.dir``) in the cache: relative path →
        md5. Check the object first (see closedloop.lineage.preflight); DvcError when unreadable."""
        path = self.cache_path(md5)
        try:
            return {entry["relpath"]: entry["md5"] for entry in json.loads(path.read_bytes())}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DvcError(f"directory object {path} cannot be read: {error}") from None

    def fetch_object(self, md5: str) -> str | None:
        """Fetch the object ``md5`` again from the default remote into the cache, keeping it only if
        its bytes hash to ``md5``. None when done; else why not (no remote, no copy there, a corrupt
        copy there too, the remote cannot be read). The new object replaces the cached one by a
        rename: a corrupt object may be linked into the workspace, and is never written into."""
        from dvc.exceptions import DvcException

        with self.locked():
            repo = self._repo()
            try:
                try:
                    odb = repo.cloud.get_remote_odb(None, "fetch")
                except DvcException as error:
                    return f"there is no default remote to fetch it from ({error})"
                where = f"the remote {repo.config['core'].get('remote')!r} ({self.remote_url()})"
                dest = self.cache_path(md5)
                dest.parent.mkdir(parents=True, exist_ok=True)
                staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
                digest = hashlib.md5()
                try:
                    remote_path = odb.oid_to_path(md5)
                    if not odb.fs.exists(remote_path):
                        return f"{where} has no copy of it"
                    with odb.fs.open(remote_path, "rb") as source, open(staging, "wb") as sink:
                        for chunk in iter(lambda: source.read(1 << 20), b""):
                            digest.update(chunk)
                            sink.write(chunk)
                except Exception as error:  # any file system's error: say it, do not stop the checks
                    staging.unlink(missing_ok=True)
                    return f"{where} cannot be read: {error}"
                if digest.hexdigest() != object_digest(md5):
                    staging.unlink()
                    return f"{where} holds a corrupt copy too (its bytes hash to {digest.hexdigest()})"
                os.chmod(staging, 0o444)  # as DVC keeps its objects
                os.replace(staging, dest)
                return None
            finally:
                repo.close()

    def _object_bytes(self, md5: str, what: str) -> bytes:
        """The cached bytes of ``md5``, hashed; a missing or corrupt object is fetched again from the
        default remote. DvcError naming ``what``, the object and why when no good copy can be had."""
        path = self.cache_path(md5)
        data = path.read_bytes() if path.is_file() else None
        if data is not None and hashlib.md5(data).hexdigest() == object_digest(md5):
            return data
        problem = "missing from the cache" if data is None else \
            f"corrupt (its bytes hash to {hashlib.md5(data).hexdigest()}, not {object_digest(md5)})"
        reason = self.fetch_object(md5)
        if reason:
            raise DvcError(f"{what}: cache object {path} is {problem}, and {reason}")
        logger.warning("%s: cache object %s was %s; fetched a good copy from the remote", what, path, problem)
        return path.read_bytes()

    # -- experiments: each iteration saved without a commit on the user's branch ----------------
    def exp_save(self, name: str) -> str:
        """Save the workspace as experiment ``name``; return the experiment's git commit.

        While `dvc exp save` runs, the git state it came from is kept in EXP_SAVE_RECORD, so that a
        save killed midway can be undone (:meth:`clean_interrupted_git_state`)."""
        untracked = _git(self.root, "ls-files", "--others", "--exclude-standard", "-z").split("\0")
        keep = [p for p in untracked if p and _is_iteration_state(p)]
        args = ["exp", "save", "--force", "-n", name]
        for path in keep:
            args += ["--include-untracked", path]
        with self.locked():
            record_path = self.root / EXP_SAVE_RECORD
            record = _git_state(self.root, keep)
            _write_json(record_path, record)
            result = None
            try:
                result = _run_dvc(self.root, args,
                                  on_start=lambda pid: _write_json(record_path, {**record, "pid": pid}))
            finally:
                if result is not None:  # the save ended, whether it succeeded or DVC undid it
                    record_path.unlink(missing_ok=True)
        if result.returncode:
            raise DvcError(f"dvc {' '.join(args)} failed in {self.root}:\n{result.stderr.strip() or result.stdout}")
        ref = _git(self.root, "for-each-ref", "--format=%(objectname)", f"refs/exps/*/*/{name}").split()
        if not ref:
            raise DvcError(f"dvc exp save did not create experiment {name!r}")
        return ref[0]

    def clean_interrupted_git_state(self) -> list[str]:
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
        if not _inside_git(self.root):
            return []
        with self.locked():
            record_path = self.root / EXP_SAVE_RECORD
            record = _read_json(record_path)
            waited = _wait_for_exit(int(record["pid"]), self.root) if record and record.get("pid") else []
            done = _remove_stale_git_locks(self.root, record.get("started") if record else None)
            locks = bool(done)
            done = waited + done + _release_dead_rwlocks(self.root)
            exec_refs = [ref for ref in _git(self.root, "for-each-ref", "--format=%(refname)", EXEC_NAMESPACE).split()
                         if ref.rsplit("/", 1)[-1] in EXEC_REFS]
            queued = _git_try(self.root, "rev-parse", "-q", "--verify", WORKSPACE_QUEUE)
            staged_args = bool(_git_try(self.root, "ls-files", "--", REPRO_ARGS))
            midway = {"EXEC_MERGE", "EXEC_BASELINE", "EXEC_BRANCH"} & {ref.rsplit("/", 1)[-1] for ref in exec_refs}
            detached = _git_try(self.root, "symbolic-ref", "-q", "HEAD") is None
            stash = _git_try(self.root, "rev-parse", "-q", "--verify", "refs/stash")
            stashed = bool(record) and stash != record.get("stash")
            if locks or staged_args or queued or midway or stashed or (detached and record):
                done += _restore_git_state(self.root, record)
                if _git_try(self.root, "ls-files", "--", REPRO_ARGS):
                    _git(self.root, "rm", "--cached", "-q", "--", REPRO_ARGS)
                    done.append(f"unstaged {REPRO_ARGS} (DVC's packed arguments, not part of the workspace)")
                for ref in exec_refs:
                    _git(self.root, "update-ref", "--no-deref", "-d", ref)  # EXEC_BRANCH is symbolic: not its target
                    done.append(f"removed ref {ref}")
                if queued:
                    entries = len(_git(self.root, "log", "-g", "--format=%H", WORKSPACE_QUEUE).split())
                    _git(self.root, "update-ref", "-d", WORKSPACE_QUEUE)
                    done.append(f"dropped {WORKSPACE_QUEUE} (DVC's workspace queue: {entries} entr"
                                f"{'y' if entries == 1 else 'ies'} of saves that never ran)")
            record_path.unlink(missing_ok=True)
            return done


    def experiments(self) -> list[str]:
        out = _git(self.root, "for-each-ref", "--format=%(refname)", "refs/exps")
        return [line.rsplit("/", 1)[-1] for line in out.split() if line.count("/") == 4]

    def experiments_newest_first(self) -> list[str]:
        """Experiment names, the most recently saved first."""
        out = _git(self.root, "for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/exps")
        return [line.rsplit("/", 1)[-1] for line in out.split() if line.count("/") == 4]

    def iteration_experiments(self) -> dict[int, str]:
        """{iteration: its newest experiment}, oldest iteration first, for every experiment the loop
        named ``iter-NNN-<fingerprint>``: an iteration re-run is saved again, and its newest save counts."""
        newest: dict[int, str] = {}
        for name in self.experiments_newest_first():
            match = ITERATION_EXPERIMENT.fullmatch(name)
            if match:
                newest.setdefault(int(match.group(1)), name)
        return dict(sorted(newest.items()))

    def experiment_rev(self, name: str) -> str:
        """The git commit of experiment ``name``; DvcError naming it when there is none."""
        if not _inside_git(self.root):
            raise DvcError(f"no DVC experiment named {name!r} in {self.root}: not a git repository")
        ref = _git(self.root, "for-each-ref", "--format=%(objectname)", f"refs/exps/*/*/{name}").split()
        if not ref:
            known = ", ".join(sorted(self.experiments())) or "none"
            raise DvcError(f"no DVC experiment named {name!r} in {self.root} (experiments: {known})")
        return ref[0]

    def git_text_at(self, path: str, version: str) -> str | None:
        """The text of the git-tracked ``path`` (relative to the workspace: metrics and info files) as
        experiment ``version`` saved it; None where that commit has no such file. DvcError naming the
        experiment when there is none."""
        # "<rev>:./<path>" is relative to the cwd given to git: the workspace, even as a subdir
        return _git_try(self.root, "show", f"{self.experiment_rev(version)}:./{path}", strip=False)

    def read_at(self, path: str, version: str) -> str:
        """The text of the DVC-tracked ``path`` (relative to the workspace) as experiment ``version``
        saved it: the cached object named by that experiment's record, hashed against it. A missing
        or corrupt object is fetched again from the default remote (whose copy is hashed first).
        DvcError naming the experiment, the file and the object when no good copy can be had."""
        found = self.locate(path, version)  # DvcError naming the experiment when there is none
        what = f"experiment {version!r}, {path}"
        if found is None:
            raise DvcError(f"{what}: the experiment does not record it (not in its dvc.lock or a .dvc file)")
        out, inner = found
        if out.get("hash") != "md5":
            return self._read_legacy(path, version, what)
        with self.locked():
            md5 = out["md5"]
            if inner:  # a file of a directory output: its hash is in the directory's listing
                self._object_bytes(md5, f"{what} (the listing of its directory)")
                md5 = self.dir_entries(md5).get(inner)
                if md5 is None:
                    raise DvcError(f"{what}: not among the files the experiment recorded for its directory")
            data = self._object_bytes(md5, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DvcError(f"{what}: not UTF-8 text ({error})") from None

    def _read_legacy(self, path: str, version: str, what: str) -> str:
        """Outputs recorded by DVC 2 (hash md5-dos2unix, no "hash" field) are read through dvc.api,
        unverified: their hash is not of the raw bytes."""
        import dvc.api

        rev = self.experiment_rev(version)
        try:
            with self.locked():
                return dvc.api.read(str(self.root / path), repo=str(self.root), rev=rev, mode="r", encoding="utf-8")
        except Exception as error:
            raise DvcError(f"{what}: cannot be read through DVC: {error}") from error

    def head_rev(self) -> str:
        try:
            return _git(self.root, "rev-parse", "HEAD").strip()
        except DvcError:
            return "(no commit)"

    def lock_hashes(self) -> dict[str, str]:
        """Each recorded output's DVC hash, from dvc.lock and the .dvc files."""
        hashes: dict[str, str] = {}
        for stage in self._lock_stages().values():
            for out in stage.get("outs", []):
                hashes[out["path"]] = out.get("md5", "")
        for dvcfile in self.root.glob("data/*.dvc"):
            for out in (_load_yaml(dvcfile.read_text()) or {}).get("outs", []):
                hashes[str(dvcfile.parent.relative_to(self.root) / out["path"])] = out.get("md5", "")
        return hashes

    def _lock_stages(self) -> dict[str, Any]:
        """dvc.lock's stages, parsed once per version of the file (it lists every code file each
        stage depends on: ~85 kB, 50 ms to parse with libyaml, 250 ms without)."""
        lock = self.root / "dvc.lock"
        try:
            stat = lock.stat()
        except FileNotFoundError:
            return {}
        key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if getattr(self, "_lock_cache", (None,))[0] != key:
            self._lock_cache = (key, (_load_yaml(lock.read_text()) or {}).get("stages") or {})
        return self._lock_cache[1]


def _load_yaml(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def pointer_file(fields: dict[str, Any], name: str) -> str:
    """The text of a ``.dvc`` file tracking ``name`` (beside it) at hash ``fields["md5"]``."""
    import yaml

    out = {"md5": fields["md5"]}
    out.update({key: fields[key] for key in ("size", "nfiles") if fields.get(key)})
    out.update({"hash": fields.get("hash", "md5"), "path": name})
    return yaml.safe_dump({"outs": [out]}, sort_keys=False)


def _configured_cache_type(root: Path) -> str:
    from dvc.config import Config

    return str(Config(dvc_dir=str(root / ".dvc"), validate=False).get("cache", {}).get("type", "") or "")


def link_cache_type(repo) -> str:
    """The cache.type for this repository's file system: the first of reflink, hardlink, symlink that
    works between its cache and its workspace (see LINK_CACHE_TYPES); "copy" where none does."""
    from dvc_objects.fs.generic import test_links

    cache = repo.cache.local
    # test_links writes its probe file beside the target path: inside the workspace, not above it.
    probe_dir = Path(repo.root_dir) / "data"
    created = not probe_dir.exists()
    try:
        supported = test_links(["reflink", "hardlink", "symlink"], cache.fs, cache.path, repo.fs,
                               str(probe_dir / "link-probe"))
    except OSError:
        supported = []
    finally:
        if created:
            with contextlib.suppress(OSError):
                probe_dir.rmdir()
    return next((LINK_CACHE_TYPES[link] for link in ("reflink", "hardlink", "symlink") if link in supported), "copy")


def _run_cache(repo):
    """DVC's run cache, except that the stage it builds to save a stage's uncached outputs names the
    workspace's dvc.yaml, not "dvc.yaml" of the process's cwd: DVC 3.67's ``StageCache._create_stage``
    does the latter, and `commit` from any other directory fails ("'/elsewhere' is outside of DVC
    repo"). The rest is DVC's own (pinned version)."""
    from dvc.stage import PipelineStage, create_stage
    from dvc.stage.cache import StageCache
    from dvc.stage.loader import StageLoader

    class RunCache(StageCache):
        def _create_stage(self, cache, wdir=None):
            stage = create_stage(PipelineStage, repo=self.repo, path=os.path.join(self.repo.root_dir, "dvc.yaml"),
                                 cmd=cache["cmd"], wdir=wdir, outs=[out["path"] for out in cache["outs"]])
            StageLoader.fill_from_lock(stage, cache)
            return stage

    return RunCache(repo)


def object_digest(md5: str) -> str:
    """The md5 an object's bytes hash to: its name, less the ``.dir`` of a directory's listing."""
    return md5.removesuffix(".dir")


def _run_dvc(root: Path, args, on_start=None) -> subprocess.CompletedProcess:
    """`python -m dvc <args>` in ``root`` (not -q: that silences DVC's error message too). Interrupted
    (Ctrl-C reaches the child too), it gives DVC's own clean-up time to finish before it goes."""
    process = subprocess.Popen([sys.executable, "-m", "dvc", *args], cwd=root, env=_git_identity_env(root),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if on_start:
            on_start(process.pid)
        stdout, stderr = process.communicate()
    except BaseException:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


















def _release_dead_rwlocks(root: Path) -> list[str]:
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
                _write_json(path, {"read": {}, "write": {}})
            done.append(f"reset {path.relative_to(root)}: a process killed while writing it left it unreadable "
                        f"({size} bytes), and DVC refuses the commands it guards until then")
    return done






def _is_iteration_state(path: str) -> bool:
    return (
        path in ("dvc.lock", "dvc.yaml", "params.yaml")
        or path.endswith(".dvc")
        or path.endswith(".gitignore")
        or path.startswith("metrics/")
    )










