"""`closedloop init`: make a directory a workspace (git + DVC, params.yaml, dvc.yaml, a DVC remote, a DVC
cache that links instead of copying). Run again on an existing workspace, it adds what is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from closedloop.config import PARAMS_FILE, default_params_yaml, load_params, write_params
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.lineage.gitstate import git_identity_env
from closedloop.pipeline import code_prefix, render_yaml
from closedloop.reports.plots import write_templates

GITIGNORE = """\
# closedloop: local stores (the DVC remote, MLflow's store and artifacts) and scratch directories.
/.dvc-remote/
/mlflow.db
/mlartifacts/
# A run's local state: the workspace lock, the progress of the iteration, Prefect's local database.
/.closedloop/
*.staging/
*.old/
*.checkpoint/
*.tmp
"""


class WorkspaceError(RuntimeError):
    pass


def init_workspace(root: Path | str) -> Path:
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not (root / PARAMS_FILE).exists():
        (root / PARAMS_FILE).write_text(default_params_yaml())
    else:
        # Validate a params.yaml the user brought, and complete it: DVC needs every key a stage lists.
        write_params(root, load_params(root))
    (root / "dvc.yaml").write_text(render_yaml(code_prefix(root)))
    gitignore = root / ".gitignore"
    existing = gitignore.read_text() if gitignore.exists() else ""
    entries = [line for line in GITIGNORE.splitlines() if line and not line.startswith("#")]
    missing = [line for line in entries if line not in existing.splitlines()]
    if missing:  # a workspace made by an older closedloop gets the entries it lacks, nothing twice
        block = GITIGNORE if missing == entries else "# closedloop\n" + "\n".join(missing) + "\n"
        gitignore.write_text(existing + ("\n" if existing and not existing.endswith("\n") else "") + block)
    DvcWorkspace(root).init()
    write_templates(root)  # the Vega-Lite templates dvc.yaml's plots name (.dvc/plots/)
    env = git_identity_env(root)
    has_head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True).returncode == 0
    if not has_head:
        # DVC experiments are saved relative to a commit, so a new repository gets a first one.
        subprocess.run(["git", "add", PARAMS_FILE, "dvc.yaml", ".gitignore", ".dvc", ".dvcignore"],
                       cwd=root, check=True, env=env, capture_output=True)
        subprocess.run(["git", "commit", "-q", "-m", "closedloop workspace"], cwd=root, check=True, env=env,
                       capture_output=True)
    return root


def require_workspace(root: Path | str) -> Path:
    root = Path(root).resolve()
    missing = [name for name in (PARAMS_FILE, "dvc.yaml", ".dvc") if not (root / name).exists()]
    if missing:
        raise WorkspaceError(
            f"{root} is not a closedloop workspace (missing {', '.join(missing)}); run `closedloop init {root}`"
        )
    return root
