"""The MLflow store an iteration records into, configured from params.yaml's ``tracking`` section."""

from __future__ import annotations

from types import ModuleType

from closedloop.config import Params
from closedloop.lineage import tracking
from closedloop.workspace import Workspace


def open_store(ws: Workspace, params: Params) -> ModuleType:
    """lineage.tracking, pointed at this workspace's store and experiment."""
    tracking.configure(ws.root, params.tracking.uri, params.tracking.experiment)
    return tracking
