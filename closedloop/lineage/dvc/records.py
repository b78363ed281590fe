"""What DVC recorded for the workspace's outputs: dvc.lock's stages and the ``.dvc`` files, as they
are in the workspace or as a git commit holds them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from closedloop.lineage.gitstate import git_try

# Where ``path`` lies in the output that records it: (the output's fields, "" for the output itself
# or the path of a file inside a directory output).
Located = tuple[dict[str, Any], str]


def load_yaml(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class Records:
    """The records of the workspace at ``root``; dvc.lock is parsed once per version of the file."""

    def __init__(self, root: Path):
        self.root = root
        self._lock: tuple[Any, dict[str, Any]] = (None, {})  # (dvc.lock's stat, its stages)

    def lock_stages(self) -> dict[str, Any]:
        """dvc.lock's stages, parsed once per version of the file (it lists every code file each
        stage depends on: ~85 kB, 50 ms to parse with libyaml, 250 ms without)."""
        lock = self.root / "dvc.lock"
        try:
            stat = lock.stat()
        except FileNotFoundError:
            return {}
        key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._lock[0] != key:
            self._lock = (key, (load_yaml(lock.read_text()) or {}).get("stages") or {})
        return self._lock[1]

    def lock_hashes(self) -> dict[str, str]:
        """Each recorded output's DVC hash, from dvc.lock and the .dvc files."""
        hashes: dict[str, str] = {}
        for stage in self.lock_stages().values():
            for out in stage.get("outs", []):
                hashes[out["path"]] = out.get("md5", "")
        for dvcfile in self.root.glob("data/*.dvc"):
            for out in (load_yaml(dvcfile.read_text()) or {}).get("outs", []):
                hashes[str(dvcfile.parent.relative_to(self.root) / out["path"])] = out.get("md5", "")
        return hashes

    def recorded_out(self, path: str, rev: str | None = None) -> dict[str, Any] | None:
        """The fields of the output that is ``path`` itself; None where no record names it."""
        found = self.locate(path, rev)
        return found[0] if found and not found[1] else None

    def locate(self, path: str, rev: str | None = None) -> Located | None:
        """The output that records ``path`` and where ``path`` lies inside it, from dvc.lock, then
        from ``<path>.dvc`` and the .dvc files of its parent folders: in the workspace, or as the git
        commit ``rev`` holds them."""
        read = self._workspace_file if rev is None else self._reader_at(rev)
        if rev is None:
            stages = self.lock_stages().values()
        else:
            lock = read("dvc.lock")
            stages = ((load_yaml(lock) or {}).get("stages") or {}).values() if lock else ()
        found = _match(path, ((out["path"], out) for stage in stages for out in stage.get("outs", [])))
        parts = Path(path).parts
        for depth in range(len(parts), 0, -1):  # <path>.dvc, then the .dvc files of its parent folders
            if found:
                break
            tracked = "/".join(parts[:depth])
            text = read(tracked + ".dvc")
            outs = (load_yaml(text) or {}).get("outs", []) if text else []
            found = _match(path, ((str(Path(tracked).parent / out["path"]).removeprefix("./"), out) for out in outs))
        return found

    def _workspace_file(self, relative: str) -> str | None:
        file = self.root / relative
        return file.read_text() if file.is_file() else None

    def _reader_at(self, rev: str) -> Callable[[str], str | None]:
        def read(relative: str) -> str | None:
            # "<rev>:./<path>" is relative to the cwd given to git: the workspace, even as a subdir
            return git_try(self.root, "show", f"{rev}:./{relative}", strip=False)

        return read


def _match(path: str, candidates: Iterable[tuple[str, dict[str, Any]]]) -> Located | None:
    """The first output (by its path) that is ``path`` or a directory holding it."""
    for out_path, out in candidates:
        if path == out_path:
            return out, ""
        if path.startswith(out_path.rstrip("/") + "/"):
            return out, path[len(out_path.rstrip("/")) + 1:]
    return None
