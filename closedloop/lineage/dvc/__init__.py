"""The only package that drives DVC (and the git plumbing DVC experiments need, through
closedloop.lineage.gitstate). Callers use :class:`DvcWorkspace`; its work lives by concept in:

- ``repository``: the git + DVC repository, the one workspace-wide lock every operation takes,
  DVC's ``Repo`` handle, and add / commit / status / push / pull;
- ``cache``: links, not copies, between the workspace and DVC's cache, and the cache's objects,
  each checked against its hash (a bad one is fetched again from the default remote);
- ``records``: what dvc.lock and the ``.dvc`` files record, now or at a git commit;
- ``references``: model versions named by their DVC hash, and restored from it;
- ``revisions``: files read as an experiment saved them, with those integrity checks;
- ``experiments``: `dvc exp save` and the experiments' names and commits;
- ``recovery``: undoing what a save killed midway left behind.

No working directory. Prefect runs tasks in threads, and the working directory belongs to the whole
process, so nothing here changes it: DVC's in-process API gets absolute targets
(``<root>/dvc.yaml:<stage>``, absolute paths), subprocesses get ``cwd=``, and what DVC reports
relative to the process's cwd (``status`` keys) is turned back into workspace-relative names.

DVC itself is imported inside the functions that use it: importing this package stays cheap for
the CLI. closedloop.lineage.preflight checks what an iteration will read before its first stage.
"""

from closedloop.lineage.dvc.cache import LINK_CACHE_TYPES, link_cache_type, object_digest
from closedloop.lineage.dvc.experiments import EXP_SAVE_RECORD, ITERATION_EXPERIMENT
from closedloop.lineage.dvc.references import pointer_file
from closedloop.lineage.dvc.repository import DEFAULT_REMOTE, DEFAULT_REMOTE_URL
from closedloop.lineage.dvc.workspace import DvcWorkspace

__all__ = [
    "DEFAULT_REMOTE",
    "DEFAULT_REMOTE_URL",
    "EXP_SAVE_RECORD",
    "ITERATION_EXPERIMENT",
    "LINK_CACHE_TYPES",
    "DvcWorkspace",
    "link_cache_type",
    "object_digest",
    "pointer_file",
]
