"""DvcWorkspace: the one class callers drive DVC through. It holds no logic of its own beyond the
order of a few steps; each method hands its work to the part that owns the concept (see the
package docstring)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from closedloop.lineage.dvc.cache import Cache
from closedloop.lineage.dvc.experiments import Experiments
from closedloop.lineage.dvc.records import Located, Records
from closedloop.lineage.dvc.recovery import clean_interrupted_git_state
from closedloop.lineage.dvc.references import References
from closedloop.lineage.dvc.repository import Repository
from closedloop.lineage.dvc.revisions import Revisions


class DvcWorkspace:
    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()
        self._repository = Repository(self.root)
        self._cache = Cache(self._repository)
        self._records = Records(self.root)
        self._experiments = Experiments(self._repository)
        self._references = References(self._repository, self._records)
        self._revisions = Revisions(self._repository, self._records, self._cache, self._experiments)

    def locked(self) -> AbstractContextManager[None]:
        """Hold the workspace lock: one DVC operation at a time, across threads and processes;
        re-entrant within a thread, so an operation may call another."""
        return self._repository.locked()

    # -- setup ---------------------------------------------------------------------------------
    def init(self) -> None:
        """Make the workspace a git + DVC repository with a local default remote and a linking cache,
        whatever of that it lacks. Idempotent: run on an existing workspace it only adds what is
        missing (a workspace made before caches linked gets its cache.type, and its tracked outputs
        that are still plain copies become links)."""
        self._repository.create()
        with self.locked():
            self._repository.add_default_remote()
            self._cache.ensure_link_type()
            self._cache.relink_outputs()

    def cache_type(self) -> str:
        """The cache.type DVC uses here, as configured at any level; "" where none is set (then DVC
        uses its default, "reflink,copy")."""
        return self._cache.link_type()

    # -- recording stages and inputs -----------------------------------------------------------
    def commit(self, stage: str) -> None:
        """Record a stage that just ran in-process in dvc.lock and the cache, as `dvc repro` would."""
        with self.locked():
            self._cache.ensure_link_type()
            self._repository.commit(stage)

    def add(self, *paths: str) -> None:
        with self.locked():
            self._cache.ensure_link_type()  # a workspace made before caches linked gets links from now on
            self._repository.add(paths)

    def push(self) -> int:
        return self._repository.push()

    def status(self) -> dict:
        """`dvc status`: each changed stage (by name; ``<file>:<name>`` or the ``.dvc`` file's path,
        relative to the workspace, for stages elsewhere) with what changed; {} when all is recorded."""
        return self._repository.status()

    def stage_up_to_date(self, name: str) -> bool:
        """True when dvc.lock records stage ``name`` and its deps, params and outs all match the
        workspace: an empty `dvc status <name>` (DVC's own check of that stage alone, not of the
        stages before it). False when dvc.lock has no record of it, anything changed, or an output is
        missing. Costs a DVC repo open, DVC's parse of dvc.yaml and dvc.lock and the hashing its state
        database cannot skip: 0.15–0.25 s on a tiny workspace with ruamel.yaml.clib installed (DVC
        parses YAML with ruamel), 0.4–1 s without; 20 ms for a stage dvc.lock does not record."""
        return name in self._records.lock_stages() and self._repository.stage_unchanged(name)

    # -- model versions by reference: the registry points at DVC's bytes, it does not copy them -----
    def reference(self, path: str) -> dict[str, Any]:
        """What names the bytes DVC recorded for the tracked ``path`` (relative to the workspace) and
        where to get them back: its hash (md5, size, nfiles; from dvc.lock or its .dvc file), the
        workspace and default remote holding the objects, the git commit, and ``dvc_file``: a DVC
        pointer file (the text of a ``.dvc`` file) for that hash. :meth:`restore` and ``dvc pull``
        turn it back into the directory."""
        return self._references.of(path)

    def remote_url(self) -> str:
        """The default remote's URL as an absolute path (local remotes) or as configured; "" if none."""
        return self._repository.remote_url()

    def restore(self, reference: dict[str, Any] | str, dest: str | Path) -> Path:
        """Bring back the directory (or file) that ``reference`` names — a dict from :meth:`reference`
        or a bare md5 such as ``"3f…e1.dir"`` — as ``dest`` inside this workspace, from the cache or,
        where the cache lacks it, the default remote (``dvc pull`` of a pointer file). The files are
        checked out the way the cache links: read-only links to the cached objects; copy them before
        changing them. Returns ``dest`` as an absolute path."""
        return self._references.restore(reference, dest)

    def recorded_out(self, path: str, version: str | None = None) -> dict[str, Any] | None:
        """What DVC recorded for the tracked ``path`` (relative to the workspace): the output's fields
        (md5, size, nfiles, hash) from dvc.lock or ``<path>.dvc``, in the workspace or, given
        ``version``, as that experiment saved them. None where neither records it."""
        return self._revisions.recorded_out(path, version)

    def locate(self, path: str, version: str | None = None) -> Located | None:
        """The output that records ``path`` and where ``path`` lies inside it ("" for the output
        itself, a relative path for a file of a directory output)."""
        return self._revisions.locate(path, version)

    # -- the objects behind the records: DVC's cache and the default remote -----------------------
    def cache_path(self, md5: str) -> Path:
        """Where the cache holds the object ``md5`` (a file's hash, or ``<hash>.dir`` for a
        directory's listing), whether or not it is there."""
        return self._cache.object_path(md5)

    def dir_entries(self, md5: str) -> dict[str, str]:
        """The files of the directory object ``md5`` (``<hash>.dir``) in the cache: relative path →
        md5. Check the object first (see closedloop.lineage.preflight); DvcError when unreadable."""
        return self._cache.dir_entries(md5)

    def fetch_object(self, md5: str) -> str | None:
        """Fetch the object ``md5`` again from the default remote into the cache, keeping it only if
        its bytes hash to ``md5``. None when done; else why not (no remote, no copy there, a corrupt
        copy there too, the remote cannot be read)."""
        return self._cache.fetch(md5)

    # -- experiments: each iteration saved without a commit on the user's branch ----------------
    def exp_save(self, name: str) -> str:
        """Save the workspace as experiment ``name``; return the experiment's git commit. A save
        killed midway can be undone (:meth:`clean_interrupted_git_state`)."""
        return self._experiments.save(name)

    def clean_interrupted_git_state(self) -> list[str]:
        """Undo what a `dvc exp save` killed midway left in the git state; one line for each thing
        done (for a warning). Run it before a run starts its work, holding the run's lock. What a
        killed save leaves, and what is never touched: closedloop.lineage.dvc.recovery."""
        return clean_interrupted_git_state(self._repository)

    def experiments(self) -> list[str]:
        return self._experiments.names()

    def experiments_newest_first(self) -> list[str]:
        """Experiment names, the most recently saved first."""
        return self._experiments.names_newest_first()

    def iteration_experiments(self) -> dict[int, str]:
        """{iteration: its newest experiment}, oldest iteration first, for every experiment the loop
        named ``iter-NNN-<fingerprint>``: an iteration re-run is saved again, and its newest save counts."""
        return self._experiments.by_iteration()

    def experiment_rev(self, name: str) -> str:
        """The git commit of experiment ``name``; DvcError naming it when there is none."""
        return self._experiments.rev(name)

    def git_text_at(self, path: str, version: str) -> str | None:
        """The text of the git-tracked ``path`` (relative to the workspace: metrics and info files) as
        experiment ``version`` saved it; None where that commit has no such file. DvcError naming the
        experiment when there is none."""
        return self._revisions.git_text(path, version)

    def read_at(self, path: str, version: str) -> str:
        """The text of the DVC-tracked ``path`` (relative to the workspace) as experiment ``version``
        saved it: the cached object named by that experiment's record, hashed against it. A missing
        or corrupt object is fetched again from the default remote (whose copy is hashed first).
        DvcError naming the experiment, the file and the object when no good copy can be had."""
        return self._revisions.dvc_text(path, version)

    def head_rev(self) -> str:
        return self._repository.head_rev()

    def lock_hashes(self) -> dict[str, str]:
        """Each recorded output's DVC hash, from dvc.lock and the .dvc files."""
        return self._records.lock_hashes()
