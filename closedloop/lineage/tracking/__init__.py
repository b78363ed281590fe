"""MLflow adapter: one run per iteration, one registry version per candidate, aliases for roles.

The only package that imports ``mlflow`` (lazily, inside each function: the import takes ~2 s and
``closedloop --help`` must stay fast). Everything the loop records goes through these functions,
so the MLflow layout lives in one place:

- run (one per iteration): params flattened to dotted keys, metrics at ``step = iteration`` (so the
  experiment's charts draw one point per iteration; names and sections: lineage.run_metrics), a
  start and end that span the iteration, dataset inputs carrying their DVC md5 as digest,
  ``plots/reward_hist.png``, ``reports/...``;
- registered model version: a LoggedModel of that run registered with lineage tags on the version;
  ``champion`` / ``challenger`` are registry aliases.

Model versions hold a reference, not the weights. DVC already keeps every model folder (its cache
and remote); a copy per version in ``mlartifacts/`` too made the registry the biggest store of a
workspace. So a version is an external LoggedModel (``mlflow.create_external_model``: no flavor,
no weights) whose artifacts are two small files:

- ``reference.json``: the DVC hash of the model folder (md5 ``….dir``, size, nfiles), the path it
  had in the workspace, the workspace, the DVC remote and the git commit;
- ``weights.dvc``: a DVC pointer file for that hash.

Getting the weights of a version back (from the DVC cache, or the remote when the cache lacks them):

    >>> ref = tracking.model_reference("closedloop-policy", "champion")   # alias or version number
    >>> DvcWorkspace(ref["workspace"]).restore(ref, "restore/champion")   # a folder in the workspace

or with the command-line tools, from the workspace:

    mlflow artifacts download -u models:/closedloop-policy@champion -d restore/champion
    dvc pull restore/champion/weights.dvc      # -> restore/champion/weights/

A version tagged ``dvc.exp_rev`` can also be had as ``dvc get . data/models/candidate --rev <rev>``.
``tracking.log_weights: true`` in params.yaml logs the full model with the transformers flavor as
well (loadable with ``mlflow.transformers.load_model``; one more full copy per version).
"""

from closedloop.lineage.tracking.client import (
    HIST_ARTIFACT,
    ITERATION_TAG,
    MODEL_ARTIFACT,
    POINTER_ARTIFACT,
    REFERENCE_ARTIFACT,
    WEIGHTS_TAG,
    configure,
    tracking_uri,
)
from closedloop.lineage.tracking.registry import (
    describe_model_version,
    find_model_version,
    get_alias,
    log_and_register_model,
    model_reference,
    model_version_description,
    model_version_tags,
    set_alias,
)
from closedloop.lineage.tracking.runs import (
    DatasetInput,
    end_interrupted_runs,
    end_run,
    find_runs,
    flatten_params,
    log_iteration,
    log_metrics,
    log_text_artifact,
    recent_iterations,
    run_key,
    run_location,
    set_run_tags,
)
from closedloop.lineage.tracking.store import check_store, log_review_traces

__all__ = [
    'DatasetInput', 'HIST_ARTIFACT', 'ITERATION_TAG', 'MODEL_ARTIFACT', 'POINTER_ARTIFACT',
    'REFERENCE_ARTIFACT', 'WEIGHTS_TAG', 'check_store', 'configure', 'describe_model_version',
    'end_interrupted_runs', 'end_run', 'find_model_version', 'find_runs', 'flatten_params', 'get_alias',
    'log_and_register_model', 'log_iteration', 'log_metrics', 'log_review_traces', 'log_text_artifact',
    'model_reference', 'model_version_description', 'model_version_tags', 'recent_iterations', 'run_key',
    'run_location', 'set_alias', 'set_run_tags', 'tracking_uri',
]
