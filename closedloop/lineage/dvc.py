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
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

DEFAULT_REMOTE = "local"
# <workspace>/.dvc-remote. DVC's config API takes the path relative to the cwd (the workspace, under
# our lock) and stores it relative to .dvc/, so the workspace can move and keep its remote.
DEFAULT_REMOTE_URL = ".dvc-remote"
# What closedloop sets where nobody set cache.type, by what the workspace's file system can do:
# - reflink (btrfs, XFS, APFS): copy-on-write clones, DVC's own default; a write makes a new copy.
# - hardlink: no "copy" fallback after it, on purpose. With "copy" in the list DVC accepts any plain
#   file as correctly checked out and never relinks it (dvc_data ``_needs_relink``), so a model
#   written again with bytes the cache already holds would stay a second full copy; without it,
#   ``add``/``commit`` replace such a file by a link to the cached object.
# - symlink: the cache lives on another file system.
LINK_CACHE_TYPES = {"reflink": "reflink,copy", "hardlink": "hardlink,symlink", "symlink": "symlink"}


class DvcError(RuntimeError):
    pass


class DvcWorkspace:
    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()

    # -- locking -------------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the workspace lock, with the workspace as cwd: DVC's in-process API resolves stage
        targets and paths against the cwd, whatever repo it was opened on."""
        from filelock import FileLock

        lock_dir = self.root / ".dvc" / "tmp"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_dir / "closedloop.lock"), timeout=600):
            previous = os.getcwd()
            os.chdir(self.root)
            try:
                yield
            finally:
                os.chdir(previous)

    def _repo(self):
        import logging

        from dvc.repo import Repo

        # "Updating lock file" and "To track the changes with git, run: ..." (DVC logs both at INFO)
        # on every stage is noise: the loop saves git state itself, as DVC experiments.
        logging.getLogger("dvc").setLevel(logging.WARNING)

        return Repo(str(self.root))

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
            repo = self._repo()
            try:
                with repo.config.edit() as config:
                    remotes = config.setdefault("remote", {})
                    if not remotes:
                        remotes[DEFAULT_REMOTE] = {"url": DEFAULT_REMOTE_URL}
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
                repo.commit(stage, force=True)
            finally:
                repo.close()

    def add(self, path: str) -> None:
        with self.locked():
            self._ensure_cache_type()  # a workspace made before caches linked gets links from now on
            repo = self._repo()
            try:
                repo.add(path)
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
        with self.locked():
            repo = self._repo()
            try:
                return repo.status()
            finally:
                repo.close()

    # -- model versions by reference: the registry points at DVC's bytes, it does not copy them -----
    def reference(self, path: str) -> dict[str, Any]:
        """What names the bytes DVC recorded for the tracked ``path`` (relative to the workspace) and
        where to get them back: its hash (md5, size, nfiles; from dvc.lock or its .dvc file), the
        workspace and default remote holding the objects, the git commit, and ``dvc_file``: a DVC
        pointer file (the text of a ``.dvc`` file) for that hash. :meth:`restore` and ``dvc pull``
        turn it back into the directory."""
        out = self._recorded_out(path)
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

    def _recorded_out(self, path: str) -> dict[str, Any] | None:
        import yaml

        lock = self.root / "dvc.lock"
        if lock.exists():
            for stage in (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).values():
                for out in stage.get("outs", []):
                    if out["path"] == path:
                        return out
        dvcfile = self.root / (path + ".dvc")
        if dvcfile.exists():
            for out in (yaml.safe_load(dvcfile.read_text()) or {}).get("outs", []):
                if out["path"] == Path(path).name:
                    return out
        return None

    # -- experiments: each iteration saved without a commit on the user's branch ----------------
    def exp_save(self, name: str) -> str:
        """Save the workspace as experiment ``name``; return the experiment's git commit."""
        untracked = _git(self.root, "ls-files", "--others", "--exclude-standard", "-z").split("\0")
        keep = [p for p in untracked if p and _is_iteration_state(p)]
        args = ["exp", "save", "--force", "-n", name]
        for path in keep:
            args += ["--include-untracked", path]
        self._cli(*args)
        ref = _git(self.root, "for-each-ref", "--format=%(objectname)", f"refs/exps/*/*/{name}").split()
        if not ref:
            raise DvcError(f"dvc exp save did not create experiment {name!r}")
        return ref[0]

    def experiments(self) -> list[str]:
        out = _git(self.root, "for-each-ref", "--format=%(refname)", "refs/exps")
        return [line.rsplit("/", 1)[-1] for line in out.split() if line.count("/") == 4]

    def experiments_newest_first(self) -> list[str]:
        """Experiment names, the most recently saved first."""
        out = _git(self.root, "for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/exps")
        return [line.rsplit("/", 1)[-1] for line in out.split() if line.count("/") == 4]

    def experiment_rev(self, name: str) -> str:
        """The git commit of experiment ``name``; DvcError naming it when there is none."""
        if not _inside_git(self.root):
            raise DvcError(f"no DVC experiment named {name!r} in {self.root}: not a git repository")
        ref = _git(self.root, "for-each-ref", "--format=%(objectname)", f"refs/exps/*/*/{name}").split()
        if not ref:
            known = ", ".join(sorted(self.experiments())) or "none"
            raise DvcError(f"no DVC experiment named {name!r} in {self.root} (experiments: {known})")
        return ref[0]

    def read_at(self, path: str, version: str) -> str:
        """The text of the DVC-tracked ``path`` (relative to the workspace) as experiment ``version``
        saved it, read through DVC from the cache (or the remote)."""
        import dvc.api

        rev = self.experiment_rev(version)
        with self.locked():
            return dvc.api.read(path, repo=str(self.root), rev=rev, mode="r")

    def head_rev(self) -> str:
        try:
            return _git(self.root, "rev-parse", "HEAD").strip()
        except DvcError:
            return "(no commit)"

    def lock_hashes(self) -> dict[str, str]:
        """Each recorded output's DVC hash, from dvc.lock and the .dvc files."""
        import yaml

        hashes: dict[str, str] = {}
        lock = self.root / "dvc.lock"
        if lock.exists():
            for stage in (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).values():
                for out in stage.get("outs", []):
                    hashes[out["path"]] = out.get("md5", "")
        for dvcfile in self.root.glob("data/*.dvc"):
            for out in (yaml.safe_load(dvcfile.read_text()) or {}).get("outs", []):
                hashes[str(dvcfile.parent.relative_to(self.root) / out["path"])] = out.get("md5", "")
        return hashes

    def _cli(self, *args: str) -> str:
        """Commands without a stable in-process API run as `dvc` itself, under our lock."""
        with self.locked():
            result = subprocess.run(
                [sys.executable, "-m", "dvc", *args, "-q"], cwd=self.root, env=_git_identity_env(self.root),
                capture_output=True, text=True,
            )
        if result.returncode:
            raise DvcError(f"dvc {' '.join(args)} failed in {self.root}:\n{result.stderr.strip() or result.stdout}")
        return result.stdout


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


def _is_iteration_state(path: str) -> bool:
    return (
        path in ("dvc.lock", "dvc.yaml", "params.yaml")
        or path.endswith(".dvc")
        or path.endswith(".gitignore")
        or path.startswith("metrics/")
    )


def _git(root: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=_git_identity_env(root))
    if result.returncode:
        raise DvcError(f"git {' '.join(args)} failed in {root}: {result.stderr.strip()}")
    return result.stdout


def _inside_git(root: Path) -> bool:
    return subprocess.run(["git", "rev-parse", "--git-dir"], cwd=root, capture_output=True).returncode == 0


def _git_toplevel(root: Path) -> Path:
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    return Path(out.stdout.strip()).resolve()


def _git_identity_env(root: Path) -> dict[str, str]:
    """Experiment commits need an identity; fresh machines and CI often have none (STACK_NOTES).
    Use the user's when set, a neutral one otherwise — never written into their git config.
    The interpreter's bin directory leads PATH so `dvc repro` finds this `closedloop`."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    probe = subprocess.run(["git", "config", "user.email"], cwd=root, capture_output=True, text=True)
    if not probe.stdout.strip():
        for role in ("AUTHOR", "COMMITTER"):
            env.setdefault(f"GIT_{role}_NAME", "closedloop")
            env.setdefault(f"GIT_{role}_EMAIL", "closedloop@localhost")
    return env
