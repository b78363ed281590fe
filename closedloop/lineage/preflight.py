"""Pre-flight: before an iteration's first stage, what it will read is present, intact and reachable.

An iteration reads the fixed benchmark, the champion and the batches it replays from earlier
experiments, and records into the MLflow tracking store. Each is checked before any work, so that a
deleted benchmark file or an unreachable store fails in a second, naming the file or the URI, not
after a whole iteration; and so that a corrupted DVC cache object is found and fetched again from
the remote instead of being read as garbage (DVC does not hash a read-only cache object again: a
corrupted one is read, pushed and checked out under its old hash).

Proportional: only what the iteration reads is hashed (the benchmark file, the champion's files, the
train sets replayed when train.mode replays), and each inode once: with a linked cache (see
lineage/dvc/) a workspace file *is* its cache object. A corrupt object is replaced by a new file
(renamed over it, never written into: other files may link to it), and every workspace file that
linked the corrupt bytes is linked again to the good ones.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path

from closedloop.io import write_json
from closedloop.lineage.dvc import DvcWorkspace, object_digest
from closedloop.lineage.gitstate import DvcError
from closedloop.lineage.mlflow_layout import tracking_uri
from closedloop.workspace import BENCHMARK_TASKS, CHAMPION, TRAIN_SET

HASH_MEMO = ".dvc/tmp/closedloop-hashes.json"


class PreflightError(RuntimeError):
    pass


def preflight(root: Path, params) -> list[str]:
    """Check the workspace at ``root`` before the first stage of an iteration run with ``params``
    (params.yaml as written for it). Returns what was repaired (for warnings); raises PreflightError
    listing every problem left, each naming the file (and experiment), what was expected and why no
    good copy could be had. The champion check applies once data/champion.dvc exists (after the warm
    start); the replay check when train.mode is rft with replay.versions and max_fraction > 0."""
    root = Path(root).resolve()
    check = _Checks(DvcWorkspace(root))
    _check_tracking(root, params, check.problems)
    with check.dvc.locked():
        check.output(BENCHMARK_TASKS)
        if (root / (CHAMPION + ".dvc")).exists():
            check.output(CHAMPION)
        replay = params.train.replay
        if params.train.mode == "rft" and replay.versions and replay.max_fraction > 0:
            for version in replay.versions:
                check.replayed(TRAIN_SET, version)
        check.relink_stale()
        check.save_memo()
    if check.problems:
        listed = "\n".join(f"  - {problem}" for problem in check.problems)
        raise PreflightError(f"pre-flight found {len(check.problems)} problem(s) in {root} before the first "
                             f"stage:\n{listed}")
    return check.notes


def check_tracking_store(root: Path, params) -> list[str]:
    """The tracking-store check alone (the warm start has nothing else to check yet)."""
    problems: list[str] = []
    _check_tracking(Path(root).resolve(), params, problems)
    if problems:
        raise PreflightError(f"pre-flight: {problems[0]}")
    return []


def _check_tracking(root: Path, params, problems: list[str]) -> None:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        source = "MLFLOW_TRACKING_URI"
    elif params.tracking.uri:
        source = "tracking.uri in params.yaml"
    else:
        source = "the default (tracking.uri unset: a SQLite store in the workspace)"
    try:
        check_store(root, params.tracking.uri)
    except ConnectionError as error:
        problems.append(f"{error} [the URI is {source}; set tracking.uri or MLFLOW_TRACKING_URI to a reachable store]")


def _load_memo(path: Path) -> dict[tuple[int, int], tuple[int, int, int, str]]:
    import json

    try:
        entries = json.loads(path.read_text())
        return {(dev, ino): (size, mtime, ctime, md5) for dev, ino, size, mtime, ctime, md5 in entries}
    except (OSError, ValueError, TypeError):
        return {}


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Checks:
    def __init__(self, dvc: DvcWorkspace):
        self.dvc, self.root = dvc, dvc.root
        self.problems: list[str] = []
        self.notes: list[str] = []
        self._stale: dict[tuple[int, int], str] = {}  # inodes of corrupt objects replaced → their md5
        self._link = dvc.cache_type().split(",")[0]  # how DVC puts a cached file into the workspace
        # (st_dev, st_ino) → (size, mtime_ns, ctime_ns, md5): what earlier checks hashed. A file whose
        # ctime is unchanged has not been written since (nothing sets a ctime back), so its bytes are
        # not hashed again: a healthy workspace costs a stat per file, not a read of the weights.
        self._memo_path = self.root / HASH_MEMO
        self._digests: dict[tuple[int, int], tuple[int, int, int, str]] = _load_memo(self._memo_path)
        self._seen: set[tuple[int, int]] = set()
        self._racy: set[tuple[int, int]] = set()  # hashed too soon after a write to be remembered

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)

    def digest(self, path: Path) -> str | None:
        """The md5 of ``path``'s bytes (through a symlink), hashed once per inode; None when missing."""
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        key, state = (stat.st_dev, stat.st_ino), (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        self._seen.add(key)
        known = self._digests.get(key)
        if known is None or known[:3] != state:
            self._digests[key] = (*state, _md5(path))
            if time.time_ns() - stat.st_ctime_ns < 2 * 10**9:
                self._racy.add(key)  # written in the last 2 s: a write in the same clock tick keeps the ctime
        return self._digests[key][3]

    def save_memo(self) -> None:
        kept = sorted(key for key in self._seen - self._racy if key in self._digests)
        write_json(self._memo_path, [[*key, *self._digests[key]] for key in kept])

    def _forget(self, path: Path) -> tuple[int, int]:
        """Before ``path`` is replaced: its inode's digest no longer holds once the number is reused."""
        stat = path.stat()
        key = (stat.st_dev, stat.st_ino)
        self._digests.pop(key, None)
        return key

    def object(self, md5: str, good_copy: Path | None = None) -> tuple[bool, str]:
        """Make the cache object ``md5`` good: from ``good_copy`` (a workspace file whose bytes hash
        right) or the default remote. Returns (good, what was wrong and what was done / why not)."""
        path = self.dvc.cache_path(md5)
        found = self.digest(path)
        if found == object_digest(md5):
            return True, ""
        state = "missing" if found is None else f"corrupt (its bytes hash to {found})"
        if found is not None:
            self._stale[self._forget(path)] = md5
        if good_copy is not None:
            _replace(good_copy, path, link=self._link == "hardlink", mode=0o444)
            return True, f"cache object {self._rel(path)} was {state}: made it again from {self._rel(good_copy)}"
        reason = self.dvc.fetch_object(md5)
        if reason is None:
            return True, (f"cache object {self._rel(path)} was {state}: fetched a good copy from the remote "
                          "(hash checked)")
        return False, f"cache object {self._rel(path)} is {state}, and {reason}"

    def output(self, path: str) -> None:
        """A tracked output of the workspace (a file or a directory) and the cache objects behind it."""
        out = self.dvc.recorded_out(path)
        if out is None:
            self.problems.append(f"{path}: DVC has no record of it (not in dvc.lock, no {path}.dvc): "
                                 "run the warm start")
            return
        if out.get("hash") != "md5":
            return  # recorded by DVC 2 (md5-dos2unix): not a hash of the raw bytes, not checked here
        record = f"{path}.dvc" if (self.root / (path + ".dvc")).exists() else "dvc.lock"
        if not out["md5"].endswith(".dir"):
            self.file(path, out["md5"], record)
            return
        good, what = self.object(out["md5"])
        if what:
            (self.notes if good else self.problems).append(f"{path} (the listing of its files): {what}")
        if not good:
            return
        try:
            entries = self.dvc.dir_entries(out["md5"])
        except DvcError as error:
            self.problems.append(f"{path}: {error}")
            return
        folder = self.root / path
        if not folder.is_dir():
            self.problems.append(f"{path}: missing ({record} records a directory of {len(entries)} files, "
                                 f"md5 {out['md5']}); `dvc checkout {path}` brings it back from the cache")
            return
        for relative, md5 in sorted(entries.items()):
            self.file(f"{path}/{relative}", md5, record)
        extra = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                       if not p.is_dir() and str(p.relative_to(folder)) not in entries)
        if extra:
            self.problems.append(f"{path}: holds files {record} does not record: {', '.join(extra)}")

    def file(self, path: str, md5: str, record: str) -> None:
        """One workspace file recorded at ``md5``, and its cache object."""
        workspace = self.root / path
        if not os.path.lexists(workspace):
            self.problems.append(f"{path}: missing ({record} records md5 {md5}); "
                                 f"`dvc checkout {path}` brings it back from the cache")
            return
        found = self.digest(workspace)
        if found == md5:
            good, what = self.object(md5, good_copy=workspace)  # the same inode when linked: no second hash
            if what:
                self.notes.append(f"{path}: {what}")
            return
        bad = "a link to a missing file" if found is None else f"its bytes hash to {found}"
        good, what = self.object(md5)
        if not good:
            self.problems.append(f"{path}: {bad}, not the md5 {md5} {record} records; {what}")
            return
        if found is not None:
            self._stale[self._forget(workspace)] = md5
        self._put(md5, workspace)
        self.notes.append(f"{path}: {bad}, not the md5 {md5} {record} records; "
                          f"{what + '; ' if what else ''}replaced it with the good copy")

    def replayed(self, path: str, version: str) -> None:
        """The cache objects behind ``path`` as experiment ``version`` saved it (what replay reads)."""
        name = f"train.replay.versions: experiment {version!r}, {path}"
        try:
            found = self.dvc.locate(path, version)
        except DvcError as error:
            self.problems.append(f"train.replay.versions: {error}")
            return
        if found is None:
            self.problems.append(f"{name}: the experiment does not record it (not in its dvc.lock or a .dvc file)")
            return
        out, inner = found
        if out.get("hash") != "md5":
            return
        md5 = out["md5"]
        if inner:
            good, what = self.object(md5)
            if not good or what:
                (self.notes if good else self.problems).append(f"{name} (its directory's listing): {what}")
            if not good:
                return
            md5 = self.dvc.dir_entries(md5).get(inner)
            if md5 is None:
                self.problems.append(f"{name}: not among the files the experiment recorded for its directory")
                return
        if self.digest(self.dvc.cache_path(md5)) == md5:
            return
        current = self.root / path  # this workspace's copy, where it is the same version (a copy cache)
        good_copy = current if current.is_file() and self.digest(current) == md5 else None
        good, what = self.object(md5, good_copy=good_copy)
        if what:
            (self.notes if good else self.problems).append(f"{name}: {what}")

    def _put(self, md5: str, target: Path) -> None:
        """Make ``target`` (a workspace file) the good cached bytes of ``md5``, as DVC links them."""
        source = self.dvc.cache_path(md5)
        if self._link == "symlink":
            staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            os.symlink(source, staging)
            os.replace(staging, target)
        else:
            _replace(source, target, link=self._link == "hardlink", mode=None)

    def relink_stale(self) -> None:
        """Workspace files of any tracked output that still link a corrupt object now replaced (the
        same bytes serve the champion, the promoted model and the candidate) get the good ones too:
        left, the next close_loop would copy the corrupt bytes back into the champion."""
        if not self._stale:
            return
        for tracked in self.dvc.lock_hashes():
            top = self.root / tracked
            files = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()] if top.is_dir() else []
            for file in files:
                stat = file.lstat()
                md5 = self._stale.get((stat.st_dev, stat.st_ino))
                if md5 is not None:
                    self._forget(file)
                    self._put(md5, file)
                    self.notes.append(f"{self._rel(file)}: linked the corrupt bytes; linked it to the good copy")


def _replace(source: Path, target: Path, *, link: bool, mode: int | None) -> None:
    """``target`` becomes ``source``'s bytes (a hard link where ``link`` and the file system allow, else
    a copy) by a rename over it: never written into, since other files may link to it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        if link:
            try:
                os.link(source, staging)
            except OSError:
                link = False
        if not link:
            shutil.copyfile(source, staging)
            if mode is not None:
                os.chmod(staging, mode)
        os.replace(staging, target)
    finally:
        if staging.exists():
            staging.unlink()


def check_store(workspace: Path, uri: str | None, timeout_s: float = 10.0) -> str:
    """Fail fast, before any work, when the tracking store that ``tracking_uri`` resolves to cannot be
    reached; return the resolved URI. ConnectionError naming the URI (its password masked) and why.

    sqlite: the database's directory exists and is writable (the database itself is not created);
    http(s): ``GET <uri>/health`` (an MLflow server answers "OK") within ``timeout_s``; file: URIs and
    plain paths: the directory is writable, or can be made in a writable parent. Other schemes
    (postgresql://, databricks, ...) are not checked here."""
    from urllib.parse import unquote, urlsplit

    resolved = tracking_uri(workspace, uri)
    parts = urlsplit(resolved)
    shown = resolved.replace(f":{parts.password}@", ":***@") if parts.password else resolved
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        import httpx

        health = resolved.rstrip("/") + "/health"
        try:
            response = httpx.get(health, timeout=timeout_s, follow_redirects=True)
        except httpx.HTTPError as error:
            raise ConnectionError(f"MLflow tracking store {shown} cannot be reached: GET /health failed "
                                  f"({type(error).__name__}: {error}; timeout {timeout_s:g} s)") from None
        if response.status_code != 200:
            raise ConnectionError(f"MLflow tracking store {shown} answered GET /health with HTTP "
                                  f"{response.status_code}: is it an MLflow server?")
        return resolved
    if scheme == "sqlite":
        path = resolved.split("://", 1)[1].lstrip("/").split("?", 1)[0]
        if not path or path == ":memory:":
            return resolved  # in memory: nothing to reach
        # sqlite:////abs/db (an absolute path) or sqlite:///rel/db (relative to the cwd), as SQLAlchemy reads it
        database = Path("/" + path) if resolved.split("://", 1)[1].startswith("//") else Path(path)
        directory = database.parent
        if not directory.is_dir():
            raise ConnectionError(f"MLflow tracking store {shown}: the directory {directory} does not exist")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConnectionError(f"MLflow tracking store {shown}: the directory {directory} is not writable")
        if database.exists() and not (database.is_file() and os.access(database, os.R_OK | os.W_OK)):
            raise ConnectionError(f"MLflow tracking store {shown}: {database} is not a readable, writable file")
        return resolved
    if scheme in ("file", ""):
        directory = Path(unquote(parts.path)) if scheme == "file" else Path(resolved)
        existing = directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            what = "is not a writable directory" if existing == directory else \
                f"does not exist and cannot be made ({existing} is not a writable directory)"
            raise ConnectionError(f"MLflow tracking store {shown}: {directory} {what}")
        return resolved
    return resolved
