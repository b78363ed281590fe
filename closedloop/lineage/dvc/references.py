"""Model versions by reference: the registry points at the bytes DVC recorded, it does not copy
them. A reference names an output's hash and where its objects are; a DVC pointer file (the text of
a ``.dvc`` file) for that hash turns it back into the directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from closedloop.lineage.dvc.records import Records
from closedloop.lineage.dvc.repository import Repository
from closedloop.lineage.gitstate import DvcError


def pointer_file(fields: dict[str, Any], name: str) -> str:
    """The text of a ``.dvc`` file tracking ``name`` (beside it) at hash ``fields["md5"]``."""
    import yaml

    out = {"md5": fields["md5"]}
    out.update({key: fields[key] for key in ("size", "nfiles") if fields.get(key)})
    out.update({"hash": fields.get("hash", "md5"), "path": name})
    return yaml.safe_dump({"outs": [out]}, sort_keys=False)


class References:
    """References to the outputs recorded in one workspace, and their restoration into it."""

    def __init__(self, repository: Repository, records: Records):
        self.repository = repository
        self.root = repository.root
        self.records = records

    def of(self, path: str) -> dict[str, Any]:
        """The reference to the output ``path`` as the workspace records it now."""
        out = self.records.recorded_out(path)
        if out is None:
            raise DvcError(f"{path} is not a DVC-tracked output of {self.root} (not in dvc.lock or a .dvc file)")
        fields = {"md5": out["md5"], "size": out.get("size"), "nfiles": out.get("nfiles"),
                  "hash": out.get("hash", "md5")}
        return {"path": path, **fields, "workspace": str(self.root), "remote": self.repository.remote_url(),
                "git_rev": self.repository.head_rev(), "dvc_file": pointer_file(fields, Path(path).name)}

    def restore(self, reference: dict[str, Any] | str, dest: str | Path) -> Path:
        """``dvc pull`` of a pointer file written beside ``dest`` for the hash, then the pointer goes."""
        fields = {"md5": reference} if isinstance(reference, str) else dict(reference)
        dest = (self.root / dest).resolve() if not Path(dest).is_absolute() else Path(dest).resolve()
        if not dest.is_relative_to(self.root):
            raise DvcError(f"restore: {dest} is not inside the workspace {self.root}; DVC checks out only there")
        if dest.exists():
            raise DvcError(f"restore: {dest} exists already")
        dest.parent.mkdir(parents=True, exist_ok=True)
        pointer = dest.with_name(dest.name + ".dvc")
        pointer.write_text(pointer_file(fields, dest.name))
        try:
            self.repository.pull(pointer)
        except Exception as error:
            raise DvcError(f"restore of {fields['md5']} into {dest} failed: {error}") from error
        finally:
            pointer.unlink(missing_ok=True)  # the pointer is a means: left behind it would be tracked state
        return dest
