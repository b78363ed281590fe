"""Reading and writing batch files: JSONL and JSON, written atomically so nothing is half-written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator


def say(line: str) -> None:
    """One line for the user, on stderr. Not ``print``: inside a flow with ``log_prints``, Prefect
    turns every print (to stderr too) into an INFO log record, which a CLI run keeps quiet."""
    import sys

    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()


class BatchFileError(ValueError):
    """A batch file is missing or malformed; the message names the file and line."""


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line, keys sorted so equal content hashes equally. Returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            count += 1
    tmp.replace(path)
    return count


def json_objects(lines: Iterable[str], source: str | Path,
                 error: type[Exception] = BatchFileError) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, object) for each non-blank line of a JSONL text, ``where`` being "<source>:<line>";
    a line that is not a JSON object raises ``error`` naming it."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as failure:
            raise error(f"{where}: not valid JSON ({failure.msg})") from None
        if not isinstance(record, dict):
            raise error(f"{where}: expected a JSON object, got {type(record).__name__}")
        yield where, record


def read_jsonl(path: Path, required: Iterable[str] = ()) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise BatchFileError(f"{path}: not found")
    required = tuple(required)
    records = []
    with path.open(encoding="utf-8") as handle:
        for where, record in json_objects(handle, path):
            missing = [key for key in required if key not in record]
            if missing:
                raise BatchFileError(f"{where}: missing field(s) {', '.join(missing)}")
            records.append(record)
    return records


def write_json(path: Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_json(path: Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise BatchFileError(f"{path}: not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise BatchFileError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None


def replace_dir(src: Path, dst: Path) -> None:
    """Make ``dst`` hold the files of ``src`` without a moment where ``dst`` is half-written.

    Files are hard-linked where the file system allows (else copied): a model folder promoted or made
    the champion costs no bytes and no time, and DVC finds it already linked to its cached object.
    That is safe because nothing in closedloop writes a file in place: every writer, this one
    included, builds a new file or directory and renames it over the old (see lineage/dvc/). The
    old ``dst`` is renamed away and deleted, never written into, so whatever else links to its
    files (the DVC cache) keeps its bytes.
    """
    dst = Path(dst)
    staging = dst.with_name(dst.name + ".staging")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(src, staging, copy_function=_link_or_copy)
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(dst, old)
    os.replace(staging, dst)
    if old.exists():
        shutil.rmtree(old)


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(os.path.realpath(src), dst)  # a symlink into the cache: link its target
    except OSError:  # another file system, no hard links, too many links: a copy
        shutil.copy2(src, dst)
    return dst
