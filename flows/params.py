"""The params a flow run works with: the workspace's params.yaml, with what the run was given laid over it.

A run's ``params`` may be partial (``{"train": {"steps": 12}}`` through the API) or a whole form the
Prefect UI filled from the deployment's defaults, a snapshot of params.yaml taken by `closedloop
serve`. Either way only what the caller set, and changed from the form it started from, overrides
the workspace; everything else is the file as it is now. The merged result is validated as a whole
before anything is written, so a bad value fails the run at once with its key named.
"""

from __future__ import annotations

from typing import Any, Optional

from closedloop.config import Params, given_settings, load_params, merge_settings


def deployment_defaults() -> Optional[dict[str, Any]]:
    """The ``params`` default of the deployment this flow run came from; None outside a deployment."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment

    if not deployment.id:
        return None
    # Read from the deployment itself: prefect.runtime.deployment.parameters is the flow run's own.
    with get_client(sync_client=True) as client:
        return (client.read_deployment(deployment.id).parameters or {}).get("params")


def workspace_params(workspace: str, given: Optional[Params]) -> Params:
    base = load_params(workspace)
    if given is None:
        return base
    # A whole form (every section set, as the UI sends it) is compared with the defaults it started
    # from; a partial override (the API, a script) is applied exactly as given, even a value equal to
    # those defaults: it was named on purpose.
    whole_form = set(type(given).model_fields) <= given.model_fields_set
    settings = given_settings(given, deployment_defaults() if whole_form else None)
    return merge_settings(base, settings, source="the run's params (laid over params.yaml)")
