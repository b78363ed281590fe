"""A workspace's git + DVC repository: the one lock every DVC operation takes, the handle DVC's
in-process API is driven through, and the operations on what is recorded (add, commit, status, push,
pull).

One workspace-wide file lock: DVC holds a repository lock of its own, but ``gc``, ``checkout`` and
``push`` are not blocked by a running ``repro`` and can corrupt it, so we serialise all of them here
(STACK_NOTES).

No working directory (Prefect runs tasks in threads, and the cwd belongs to the whole process): DVC
gets absolute targets (``<root>/dvc.yaml:<stage>``, absolute paths), and what it reports relative to
the process's cwd (``status`` keys) is turned back into workspace-relative names.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from closedloop.lineage.gitstate import DvcError, git, git_toplevel, inside_git

DEFAULT_REMOTE = "local"
# <workspace>/.dvc-remote, stored relative to .dvc/ (as "../.dvc-remote") so the workspace can move
# and keep its remote.
DEFAULT_REMOTE_URL = ".dvc-remote"


class Repository:
    """The repository of the workspace at ``root`` (absolute). Each operation holds the lock."""

    def __init__(self, root: Path):
        self.root = root

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

    @contextmanager
    def opened(self) -> Iterator[Any]:
        """DVC's ``Repo`` of the workspace, closed when the block ends. Caller holds the lock."""
        from dvc.repo import Repo

        # "Updating lock file" and "To track the changes with git, run: ..." (DVC logs both at INFO)
        # on every stage is noise: the loop saves git state itself, as DVC experiments.
        logging.getLogger("dvc").setLevel(logging.WARNING)

        repo = Repo(str(self.root))
        repo.stage_cache = _run_cache(repo)
        try:
            yield repo
        finally:
            repo.close()

    def stage_target(self, stage: str) -> str:
        # DVC resolves a bare stage name against dvc.yaml of the process's cwd: name the file.
        return f"{self.root / 'dvc.yaml'}:{stage}"

    def absolute(self, path: str | Path) -> Path:
        return Path(path) if Path(path).is_absolute() else self.root / path

    # -- setup ---------------------------------------------------------------------------------
    def create(self) -> None:
        """Make the workspace a git repository and a DVC repository, whichever it is not yet."""
        if not inside_git(self.root):
            git(self.root, "init", "-q")
        if not (self.root / ".dvc").exists():
            from dvc.repo import Repo

            Repo.init(str(self.root), subdir=git_toplevel(self.root) != self.root)

    def add_default_remote(self) -> None:
        """Give a workspace that has no remote at all a local default one (DEFAULT_REMOTE_URL)."""
        with self.locked():
            from dvc.config_schema import RelPath

            with self.opened() as repo, repo.config.edit() as config:
                remotes = config.setdefault("remote", {})
                if not remotes:
                    # RelPath: DVC stores it relative to .dvc/ (a plain absolute path stays absolute)
                    remotes[DEFAULT_REMOTE] = {"url": RelPath(str(self.root / DEFAULT_REMOTE_URL))}
                    config.setdefault("core", {})["remote"] = DEFAULT_REMOTE

    def remote_url(self) -> str:
        """The default remote's URL as an absolute path (local remotes) or as configured; "" if none."""
        from dvc.config import Config

        config = Config(dvc_dir=str(self.root / ".dvc"), validate=False)
        name = config.get("core", {}).get("remote")
        url = config.get("remote", {}).get(name, {}).get("url", "") if name else ""
        if url and "://" not in url and not os.path.isabs(url):
            url = os.path.normpath(self.root / ".dvc" / url)  # DVC stores local remotes relative to .dvc/
        return url

    def head_rev(self) -> str:
        try:
            return git(self.root, "rev-parse", "HEAD").strip()
        except DvcError:
            return "(no commit)"

    # -- recording stages and inputs -----------------------------------------------------------
    def commit(self, stage: str) -> None:
        with self.locked(), self.opened() as repo:
            repo.commit(self.stage_target(stage), force=True)

    def add(self, paths: tuple[str, ...]) -> None:
        with self.locked(), self.opened() as repo:
            repo.add([str(self.absolute(path)) for path in paths])

    def push(self) -> int:
        with self.locked(), self.opened() as repo:
            return repo.push()

    def pull(self, target: Path) -> None:
        with self.locked(), self.opened() as repo:
            repo.pull(targets=[str(target)])

    def status(self) -> dict:
        with self.locked(), self.opened() as repo:
            return {self._status_key(key): value for key, value in repo.status().items()}

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

    def stage_unchanged(self, name: str) -> bool:
        """An empty `dvc status <name>`: DVC's own check of that stage alone, not of the stages
        before it. False where dvc.yaml has no such stage."""
        from dvc.stage.exceptions import StageNotFound

        with self.locked(), self.opened() as repo:
            try:
                return not repo.status(targets=[self.stage_target(name)])
            except StageNotFound:
                return False


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
