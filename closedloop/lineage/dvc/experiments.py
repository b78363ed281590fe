"""DVC experiments: each iteration is saved as a git commit under ``refs/exps``, never as a commit
on the user's branch. A save runs `dvc exp save` in a subprocess and leaves a record of the git
state it started from, so that a save killed midway can be undone (closedloop.lineage.dvc.recovery).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

from closedloop.lineage.dvc.repository import Repository
from closedloop.lineage.gitstate import (
    DvcError,
    git,
    git_identity_env,
    inside_git,
    record_git_state,
    write_record,
)

# What exp_save records before it runs `dvc exp save` (HEAD, the stash, the index, the files) and deletes
# once that process has ended: found by clean_interrupted_git_state, it says a save was killed midway
# and what the git state was before it.
EXP_SAVE_RECORD = ".dvc/tmp/closedloop-exp-save.json"

# How the loop names the experiment of an iteration: its number, then its candidate's fingerprint.
ITERATION_EXPERIMENT = re.compile(r"iter-(\d+)-[0-9a-f]+")


class Experiments:
    """The DVC experiments of one repository, by name."""

    def __init__(self, repository: Repository):
        self.repository = repository
        self.root = repository.root

    def save(self, name: str) -> str:
        """Save the workspace as experiment ``name``; return the experiment's git commit.

        While `dvc exp save` runs, the git state it came from is kept in EXP_SAVE_RECORD, so that a
        save killed midway can be undone (recovery.clean_interrupted_git_state)."""
        untracked = git(self.root, "ls-files", "--others", "--exclude-standard", "-z").split("\0")
        keep = [p for p in untracked if p and _is_iteration_state(p)]
        args = ["exp", "save", "--force", "-n", name]
        for path in keep:
            args += ["--include-untracked", path]
        with self.repository.locked():
            record_path = self.root / EXP_SAVE_RECORD
            record = record_git_state(self.root, keep)
            write_record(record_path, record)
            result = None
            try:
                result = run_dvc(self.root, args,
                                 on_start=lambda pid: write_record(record_path, {**record, "pid": pid}))
            finally:
                if result is not None:  # the save ended, whether it succeeded or DVC undid it
                    record_path.unlink(missing_ok=True)
        if result.returncode:
            raise DvcError(f"dvc {' '.join(args)} failed in {self.root}:\n{result.stderr.strip() or result.stdout}")
        ref = git(self.root, "for-each-ref", "--format=%(objectname)", f"refs/exps/*/*/{name}").split()
        if not ref:
            raise DvcError(f"dvc exp save did not create experiment {name!r}")
        return ref[0]

    def names(self) -> list[str]:
        out = git(self.root, "for-each-ref", "--format=%(refname)", "refs/exps")
        return [line.rsplit("/", 1)[-1] for line in out.split() if line.count("/") == 4]

    def names_newest_first(self) -> list[str]:
        """Experiment names, the most recently saved first."""
        out = git(self.root, "for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/exps")
        return [line.rsplit("/", 1)[-1] for line in out.split() if line.count("/") == 4]

    def by_iteration(self) -> dict[int, str]:
        """{iteration: its newest experiment}, oldest iteration first, for every experiment the loop
        named ``iter-NNN-<fingerprint>``: an iteration re-run is saved again, and its newest save counts."""
        newest: dict[int, str] = {}
        for name in self.names_newest_first():
            match = ITERATION_EXPERIMENT.fullmatch(name)
            if match:
                newest.setdefault(int(match.group(1)), name)
        return dict(sorted(newest.items()))

    def rev(self, name: str) -> str:
        """The git commit of experiment ``name``; DvcError naming it when there is none."""
        if not inside_git(self.root):
            raise DvcError(f"no DVC experiment named {name!r} in {self.root}: not a git repository")
        ref = git(self.root, "for-each-ref", "--format=%(objectname)", f"refs/exps/*/*/{name}").split()
        if not ref:
            known = ", ".join(sorted(self.names())) or "none"
            raise DvcError(f"no DVC experiment named {name!r} in {self.root} (experiments: {known})")
        return ref[0]


def run_dvc(root: Path, args, on_start=None) -> subprocess.CompletedProcess:
    """`python -m dvc <args>` in ``root`` (not -q: that silences DVC's error message too). Interrupted
    (Ctrl-C reaches the child too), it gives DVC's own clean-up time to finish before it goes."""
    process = subprocess.Popen([sys.executable, "-m", "dvc", *args], cwd=root, env=git_identity_env(root),
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


def _is_iteration_state(path: str) -> bool:
    """An untracked file an iteration's save must include: what DVC and the loop record."""
    return (
        path in ("dvc.lock", "dvc.yaml", "params.yaml")
        or path.endswith(".dvc")
        or path.endswith(".gitignore")
        or path.startswith("metrics/")
    )
