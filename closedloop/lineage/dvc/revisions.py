"""Reads of what an experiment saved, at its git commit: the record that names a tracked file, the
text of git-tracked files, and the text of DVC-tracked files from the cache, hashed against that
record (a missing or corrupt object is fetched again from the default remote)."""

from __future__ import annotations

from typing import Any

from closedloop.lineage.dvc.cache import Cache
from closedloop.lineage.dvc.experiments import Experiments
from closedloop.lineage.dvc.records import Located, Records
from closedloop.lineage.dvc.repository import Repository
from closedloop.lineage.gitstate import DvcError, git_try


class Revisions:
    """The workspace's files as an experiment (by name) saved them; ``version=None``: as they are now."""

    def __init__(self, repository: Repository, records: Records, cache: Cache, experiments: Experiments):
        self.repository = repository
        self.root = repository.root
        self.records = records
        self.cache = cache
        self.experiments = experiments

    def locate(self, path: str, version: str | None = None) -> Located | None:
        rev = None if version is None else self.experiments.rev(version)  # DvcError naming a missing one
        return self.records.locate(path, rev)

    def recorded_out(self, path: str, version: str | None = None) -> dict[str, Any] | None:
        rev = None if version is None else self.experiments.rev(version)
        return self.records.recorded_out(path, rev)

    def git_text(self, path: str, version: str) -> str | None:
        # "<rev>:./<path>" is relative to the cwd given to git: the workspace, even as a subdir
        return git_try(self.root, "show", f"{self.experiments.rev(version)}:./{path}", strip=False)

    def dvc_text(self, path: str, version: str) -> str:
        """The text of the DVC-tracked ``path`` as experiment ``version`` saved it, hashed against
        its record. DvcError naming the experiment, the file and the object when no good copy can
        be had."""
        found = self.locate(path, version)  # DvcError naming the experiment when there is none
        what = f"experiment {version!r}, {path}"
        if found is None:
            raise DvcError(f"{what}: the experiment does not record it (not in its dvc.lock or a .dvc file)")
        out, inner = found
        if out.get("hash") != "md5":
            return self._read_legacy(path, version, what)
        with self.repository.locked():
            md5 = out["md5"]
            if inner:  # a file of a directory output: its hash is in the directory's listing
                self.cache.verified_bytes(md5, f"{what} (the listing of its directory)")
                md5 = self.cache.dir_entries(md5).get(inner)
                if md5 is None:
                    raise DvcError(f"{what}: not among the files the experiment recorded for its directory")
            data = self.cache.verified_bytes(md5, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DvcError(f"{what}: not UTF-8 text ({error})") from None

    def _read_legacy(self, path: str, version: str, what: str) -> str:
        """Outputs recorded by DVC 2 (hash md5-dos2unix, no "hash" field) are read through dvc.api,
        unverified: their hash is not of the raw bytes."""
        import dvc.api

        rev = self.experiments.rev(version)
        try:
            with self.repository.locked():
                return dvc.api.read(str(self.root / path), repo=str(self.root), rev=rev, mode="r", encoding="utf-8")
        except Exception as error:
            raise DvcError(f"{what}: cannot be read through DVC: {error}") from error
