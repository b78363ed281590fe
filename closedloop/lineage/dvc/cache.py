"""DVC's cache as closedloop uses it: workspace files are links to its objects, and every object read
is checked against its hash.

Links, not copies. DVC copies every cached file into the workspace by default, so a model folder
lived twice (workspace + ``.dvc/cache``) before the remote and MLflow added theirs. A workspace
gets a ``cache.type`` that links where its file system allows (:func:`link_cache_type`): then a
tracked file in the workspace *is* the cache object (a hardlink to it, or a symlink), read-only.
Writing such a file in place would change the cached bytes of every version that shares them, and
DVC trusts a read-only cache object without hashing it again (it would push and check out the
corrupted bytes under the old hash), so nothing in closedloop ever does: every writer writes a new
file or directory and renames it over the old one (``closedloop.io``: ``write_json``/
``write_jsonl``/``replace_dir``; the warmstart and train stages save into ``*.staging`` and
rename; validate deletes its folder first), and DVC itself removes a link before it checks out
another. Being root does not make a read-only link writable by accident here: nobody opens one
for writing.

Integrity. For the same reason a corrupted object would be read, pushed and checked out under its
old hash: :meth:`Cache.verified_bytes` hashes what it reads, and a missing or bad object is fetched
again from the default remote, whose copy is hashed first (:meth:`Cache.fetch`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from pathlib import Path

from closedloop.lineage.dvc.repository import Repository
from closedloop.lineage.gitstate import DvcError

# What closedloop sets where nobody set cache.type, by what the workspace's file system can do:
# - reflink (btrfs, XFS, APFS): copy-on-write clones, DVC's own default; a write makes a new copy.
# - hardlink: no "copy" fallback after it, on purpose. With "copy" in the list DVC accepts any plain
#   file as correctly checked out and never relinks it (dvc_data ``_needs_relink``), so a model
#   written again with bytes the cache already holds would stay a second full copy; without it,
#   ``add``/``commit`` replace such a file by a link to the cached object.
# - symlink: the cache lives on another file system.
LINK_CACHE_TYPES = {"reflink": "reflink,copy", "hardlink": "hardlink,symlink", "symlink": "symlink"}

# The package's logger, not this module's: the name people configure is closedloop.lineage.dvc.
logger = logging.getLogger(__package__)


def object_digest(md5: str) -> str:
    """The md5 an object's bytes hash to: its name, less the ``.dir`` of a directory's listing."""
    return md5.removesuffix(".dir")


def configured_cache_type(root: Path) -> str:
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


class Cache:
    """The DVC cache of one repository: how it links into the workspace, and its objects."""

    def __init__(self, repository: Repository):
        self.repository = repository
        self.root = repository.root
        self._dir: Path | None = None  # read from DVC's config once: cache_path runs per object

    # -- links -----------------------------------------------------------------------------------
    def link_type(self) -> str:
        """The cache.type DVC uses here, as configured at any level; "" where none is set (then DVC
        uses its default, "reflink,copy")."""
        return configured_cache_type(self.root)

    def ensure_link_type(self) -> None:
        """Set cache.type where no level of DVC's config sets it, chosen by a probe of the links this
        file system supports. Written to .dvc/config.local: it describes this machine's file system,
        not the project (a clone elsewhere probes its own). Cheap once set. Caller holds the lock."""
        if configured_cache_type(self.root):
            return  # the user's (or an earlier init's) choice stands
        with self.repository.opened() as repo:
            chosen = link_cache_type(repo)
            with repo.config.edit("local") as config:
                config.setdefault("cache", {})["type"] = chosen

    def relink_outputs(self) -> None:
        """Replace tracked outputs that are plain copies of their cached objects by links (what
        `dvc checkout --relink` does), skipping any output that differs from what DVC recorded or
        whose object is not in the cache: this never overwrites or deletes a user's bytes.
        Caller holds the lock."""
        from dvc.exceptions import DvcException

        with self.repository.opened() as repo:
            if configured_cache_type(self.root).split(",")[0] not in ("hardlink", "symlink"):
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

    # -- objects ---------------------------------------------------------------------------------
    def object_path(self, md5: str) -> Path:
        """Where the cache holds the object ``md5`` (a file's hash, or ``<hash>.dir`` for a
        directory's listing), whether or not it is there."""
        if self._dir is None:
            from dvc.config import Config

            configured = Config(dvc_dir=str(self.root / ".dvc"), validate=False).get("cache", {}).get("dir")
            self._dir = (self.root / ".dvc" / configured) if configured else self.root / ".dvc" / "cache"
        return self._dir / "files" / "md5" / md5[:2] / md5[2:]

    def dir_entries(self, md5: str) -> dict[str, str]:
        """The files of the directory object ``md5`` (``<hash>.dir``) in the cache: relative path →
        md5. Check the object first (see closedloop.lineage.preflight); DvcError when unreadable."""
        path = self.object_path(md5)
        try:
            return {entry["relpath"]: entry["md5"] for entry in json.loads(path.read_bytes())}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DvcError(f"directory object {path} cannot be read: {error}") from None

    def fetch(self, md5: str) -> str | None:
        """Fetch the object ``md5`` again from the default remote into the cache, keeping it only if
        its bytes hash to ``md5``. None when done; else why not (no remote, no copy there, a corrupt
        copy there too, the remote cannot be read). The new object replaces the cached one by a
        rename: a corrupt object may be linked into the workspace, and is never written into."""
        from dvc.exceptions import DvcException

        with self.repository.locked(), self.repository.opened() as repo:
            try:
                odb = repo.cloud.get_remote_odb(None, "fetch")
            except DvcException as error:
                return f"there is no default remote to fetch it from ({error})"
            where = f"the remote {repo.config['core'].get('remote')!r} ({self.repository.remote_url()})"
            dest = self.object_path(md5)
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

    def verified_bytes(self, md5: str, what: str) -> bytes:
        """The cached bytes of ``md5``, hashed; a missing or corrupt object is fetched again from the
        default remote. DvcError naming ``what``, the object and why when no good copy can be had."""
        path = self.object_path(md5)
        data = path.read_bytes() if path.is_file() else None
        if data is not None and hashlib.md5(data).hexdigest() == object_digest(md5):
            return data
        problem = "missing from the cache" if data is None else \
            f"corrupt (its bytes hash to {hashlib.md5(data).hexdigest()}, not {object_digest(md5)})"
        reason = self.fetch(md5)
        if reason:
            raise DvcError(f"{what}: cache object {path} is {problem}, and {reason}")
        logger.warning("%s: cache object %s was %s; fetched a good copy from the remote", what, path, problem)
        return path.read_bytes()
