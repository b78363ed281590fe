"""Reading and writing a workspace's params.yaml, and the commented default one ``closedloop init`` writes."""

from __future__ import annotations

import io
from pathlib import Path

from pydantic import BaseModel

from closedloop.config.base import PARAMS_FILE
from closedloop.config.params import ConfigError, Params, parse_params


def load_params(workspace: Path | str = ".") -> Params:
    """Read and validate ``params.yaml`` of a workspace. Never called at import time."""
    import yaml

    path = Path(workspace) / PARAMS_FILE
    if not path.exists():
        raise ConfigError(f"{path}: not found (run `closedloop init` to create a workspace)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_params(data, str(path))


def write_params(workspace: Path | str, params: Params) -> bool:
    """Write ``params`` into params.yaml, keeping the file's comments and key order.

    Returns True when the file changed. Every key is written, defaults included, because DVC reads
    the exact keys each stage lists from this file; values already right are left untouched, so a
    params.yaml a person wrote stays readable after the loop bumps ``loop.iteration``.
    """
    from ruamel.yaml import YAML

    path = Path(workspace) / PARAMS_FILE
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 120
    document = yaml.load(path.read_text()) if path.exists() else None
    if document is None:
        from ruamel.yaml.comments import CommentedMap

        document = CommentedMap()
    changed = _merge(document, params.model_dump(mode="json"))
    if changed or not path.exists():
        tmp = path.with_suffix(".yaml.tmp")
        with tmp.open("w") as handle:
            yaml.dump(document, handle)
        tmp.replace(path)
    return changed


def _merge(document: dict, wanted: dict) -> bool:
    changed = False
    for key, value in wanted.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            changed |= _merge(document[key], value)
        elif key not in document or document[key] != value:
            document[key] = value
            changed = True
    return changed


def default_params_yaml() -> str:
    """params.yaml with every default and each field's description as a comment."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    def build(model: BaseModel) -> CommentedMap:
        node = CommentedMap()
        for name, info in type(model).model_fields.items():
            value = getattr(model, name)
            node[name] = build(value) if isinstance(value, BaseModel) else _plain(value)
            if info.description:
                node.yaml_add_eol_comment(info.description, name)
        return node

    yaml = YAML()
    yaml.width = 120
    buffer = io.StringIO()
    yaml.dump(build(Params()), buffer)
    header = (
        "# closedloop — the one config file, typed by closedloop/config/.\n"
        "# Unknown keys and wrong types are errors that name the key. The loop sets loop.iteration.\n"
    )
    return header + buffer.getvalue()


def _plain(value):
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value
