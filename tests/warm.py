"""A warm-started workspace made once per test run and copied per test (tests/conftest.py `warm_template`).

The copy is the template's bytes under another path: git, DVC (cache, remote and the hardlinks between
the cache and the workspace, which `cp -a` keeps), MLflow's SQLite store and artifacts, the loop's
progress record. What names the template's absolute path is rebased onto the copy's: every text value
in mlflow.db (artifact locations, run tags, params), the text files of MLflow's artifacts (MLmodel,
reference.json, reports) and DVC's record of its last experiment run; DVC's packed arguments of that
run (a pickle, rewritten by every `dvc exp save`) are dropped. What DVC tracks is left byte for byte
(the GX report names its data docs by path; rewriting it would change its hash). A copy that still
names the template anywhere else fails at once, so a new absolute path the loop starts writing cannot
leak between tests. No pytest here."""

from __future__ import annotations

import copy
import sqlite3
import subprocess
from pathlib import Path

import yaml

# Where the template's path may stay: object stores (content-addressed; DVC-tracked bytes are the
# template's own) and DVC-tracked outputs.
_LEFT_AS_IS = (".git/objects", ".dvc/cache", ".dvc-remote", "data")


def copy_warm_workspace(template: Path, dest: Path, overrides: dict | None = None) -> Path:
    """Copy the warm-started ``template`` workspace to ``dest`` (which must not exist), rebase its
    absolute paths, and lay ``overrides`` ({section: {key: value}}) over its params.yaml, as a user
    editing params.yaml after the warm start would. Returns ``dest``."""
    template, dest = Path(template).resolve(), Path(dest).resolve()
    if overrides:
        _refuse_warm_start_params(template, overrides)  # before anything is copied
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(template), str(dest)], check=True)
    old, new = str(template), str(dest)
    _rebase_sqlite(dest / "mlflow.db", old, new)
    for path in [*dest.joinpath("mlartifacts").rglob("*"), *dest.joinpath(".dvc", "tmp", "exps").rglob("*.run")]:
        if path.is_file() and not path.is_symlink():
            _rebase_text(path, old, new)
    dest.joinpath(".dvc", "tmp", "repro.dat").unlink(missing_ok=True)
    _assert_no_trace(dest, old)
    if overrides:
        params_path = dest / "params.yaml"
        params = yaml.safe_load(params_path.read_text())
        for section, values in copy.deepcopy(overrides).items():
            params.setdefault(section, {}).update(values)
        params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


def _refuse_warm_start_params(root: Path, overrides: dict) -> None:
    """An override of a param the warm start reads would leave the copy's warm start stale (DVC would
    say so, and the copy would not be what a warm start on those params makes): name it and refuse."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    read = {key for name in ("benchmark", "warmstart") for key in stages[name].get("params", [])}
    clashes = [f"{section}.{key}" for section, values in overrides.items() for key in values
               if section in read or f"{section}.{key}" in read]
    if clashes:
        raise ValueError(f"warm_copy overrides {clashes}, which the warm start reads: make that workspace's "
                         "own warm start instead")


def _rebase_text(path: Path, old: str, new: str) -> None:
    data = path.read_bytes()
    if old.encode() not in data:
        return
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return  # binary (model weights): left for _assert_no_trace to name if it holds the path
    path.write_text(text.replace(old, new))


def _rebase_sqlite(db: Path, old: str, new: str) -> None:
    connection = sqlite3.connect(db)
    try:
        tables = [row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        for table in tables:
            for column in [row[1] for row in connection.execute(f'PRAGMA table_info("{table}")')]:
                connection.execute(f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) '
                                   f'WHERE typeof("{column}") = \'text\' AND instr("{column}", ?) > 0',
                                   (old, new, old))
        connection.commit()
        connection.execute("VACUUM")  # the old values must not linger in free pages
    finally:
        connection.close()


def _assert_no_trace(root: Path, old: str) -> None:
    needle = old.encode()
    left = []
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if any(relative == kept or relative.startswith(kept + "/") for kept in _LEFT_AS_IS):
            continue
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
            left.append(relative)
    if left:
        raise AssertionError(f"the copy of {old} still names it in {left}: tests/warm.py must rebase them")
