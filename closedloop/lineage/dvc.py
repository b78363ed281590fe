"""The only module that drives DVC (and the git plumbing DVC experiments need).

Every operation takes one workspace-wide file lock: DVC holds a repository lock of its own, but
``gc``, ``checkout`` and ``push`` are not blocked by a running ``repro`` and can corrupt it, so we
serialise all of them here (STACK_NOTES).
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

DEFAULT_REMOTE = "local"
# <workspace>/.dvc-remote. DVC's config API takes the path relative to the cwd (the workspace, under
# our lock) and stores it relative to .dvc/, so the workspace can move and keep its remote.
DEFAULT_REMOTE_URL = ".dvc-remote"


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
        """Make the workspace a git + DVC repository with a local default remote, if it is not one."""
        if not _inside_git(self.root):
            _git(self.root, "init", "-q")
        if not (self.root / ".dvc").exists():
            from dvc.repo import Repo

            Repo.init(str(self.root), subdir=_git_toplevel(self.root) != self.root)
        with self.locked():
            repo = self._repo()
            with repo.config.edit() as config:
                remotes = config.setdefault("remote", {})
                if not remotes:
                    remotes[DEFAULT_REMOTE] = {"url": DEFAULT_REMOTE_URL}
                    config.setdefault("core", {})["remote"] = DEFAULT_REMOTE
            repo.close()

    # -- recording stages and inputs -----------------------------------------------------------
    def commit(self, stage: str) -> None:
        """Record a stage that just ran in-process in dvc.lock and the cache, as `dvc repro` would."""
        with self.locked():
            repo = self._repo()
            try:
                repo.commit(stage, force=True)
            finally:
                repo.close()

    def add(self, path: str) -> None:
        with self.locked():
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
