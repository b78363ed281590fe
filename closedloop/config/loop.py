"""Running the loop: the project seed and iteration, the monitors, the gate, human review, tracking,
versioning and where shards execute."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from closedloop.config.base import Section
from closedloop.monitor_catalog import MONITOR_NAMES, WARN_ONLY_MONITORS


class ProjectParams(Section):
    seed: int = Field(1234, description="Base seed; every stage derives its own seed from it.")


class LoopParams(Section):
    iteration: int = Field(0, ge=0, description="Set by the loop before each iteration; seeds the new training tasks.")


class MonitorThreshold(Section):
    """Above ``warn`` a monitor warns, above ``fail`` it fails (every monitor's value is higher-is-worse)."""

    warn: float = Field(description="The monitor warns when its value exceeds this.")
    fail: Optional[float] = Field(
        None, description="The monitor fails when its value exceeds this (null: it only ever warns).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> "MonitorThreshold":
        if self.fail is not None and self.fail < self.warn:
            raise ValueError(f"fail ({self.fail}) must not be below warn ({self.warn})")
        return self


class MonitorsParams(Section):
    enabled: bool = Field(True, description="Run the monitors stage's checks (off: every monitor is skipped).")
    history: int = Field(3, ge=0, description="Previous iterations' batches (DVC experiments) each batch is compared with.")
    versions: list[str] = Field(
        default_factory=list,
        description="The experiments compared with, oldest first; set by the loop from `history` before each iteration.",
    )
    block_promotion: list[str] = Field(
        default_factory=list, description="Monitors whose fail makes the gate hold the candidate.",
    )
    thresholds: dict[str, MonitorThreshold] = Field(
        default_factory=dict, description="Per-monitor {warn, fail} overriding the defaults (closedloop/monitors).",
    )
    canary_per_env: int = Field(
        4, ge=0, description="Benchmark tasks per environment in the canary set (their references and blank answers).",
    )

    @field_validator("block_promotion")
    @classmethod
    def _known_blocking(cls, names: list[str]) -> list[str]:
        unknown = [name for name in names if name not in MONITOR_NAMES]
        if unknown:
            raise ValueError(f"unknown monitor {', '.join(map(repr, unknown))}; the monitors are {', '.join(MONITOR_NAMES)}")
        return names

    @field_validator("thresholds")
    @classmethod
    def _known_thresholds(cls, thresholds: dict) -> dict:
        unknown = [name for name in thresholds if name not in MONITOR_NAMES]
        if unknown:
            raise ValueError(f"unknown monitor {', '.join(map(repr, unknown))}; the monitors are {', '.join(MONITOR_NAMES)}")
        return thresholds

    @model_validator(mode="after")
    def _blocking_can_fail(self) -> "MonitorsParams":
        # A monitor that only warns (its fail threshold is null) would sit in block_promotion holding
        # nothing, silently: refuse it, naming the threshold to set.
        for name in self.block_promotion:
            given = self.thresholds.get(name)
            if (given.fail is None) if given is not None else name in WARN_ONLY_MONITORS:
                raise ValueError(f"monitors.block_promotion: {name!r} only warns (its fail threshold is null), so it "
                                 f"could never hold the gate; set monitors.thresholds.{name}.fail")
        return self


class GateParams(Section):
    min_improvement: float = Field(0.0, ge=0.0, description="Overall pass@1 gain the candidate must exceed.")
    slice_tolerance: float = Field(0.05, ge=0.0, description="Largest pass@1 drop allowed on any env or env/slice.")
    noise_z: float = Field(
        2.0, ge=0.0,
        description="A drop is a regression only beyond this many standard errors of the difference too (0: tolerance only).",
    )
    confirm_samples: int = Field(
        16, ge=0,
        description="An env or slice that regressed is evaluated again, both models, with this many samples per task and a new seed, and decided on those figures (0: decide on the first).",
    )


class ReviewStrata(Section):
    """How the review sample is drawn: evenly over environment × bucket, plus the disagreements."""

    per_env_bucket: int = Field(1, ge=0, description="Samples drawn from each environment × grading bucket.")
    partial_failed: int = Field(2, ge=0, description="Samples with partial credit whose verdict is fail.")
    validators_disagree: int = Field(2, ge=0, description="Samples whose reward components disagree (one 1, another 0).")
    near_threshold: int = Field(2, ge=0, description="Samples whose reward lies within `margin` of `threshold`.")
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="The reward a near-threshold sample is close to.")
    margin: float = Field(0.1, ge=0.0, le=1.0, description="How close to `threshold` a near-threshold reward lies.")


class ReviewParams(Section):
    mode: Literal["off", "async", "before_promotion"] = Field(
        "async",
        description="off: no human review; async: each iteration draws a review sample that people answer "
        "when they can (the next iteration reads the answers); before_promotion: the gate waits for the review.",
    )
    size: int = Field(24, ge=0, description="Most samples one review shows (strata first, then disagreements).")
    strata: ReviewStrata = ReviewStrata()
    timeout_s: float = Field(
        3600.0, gt=0, description="before_promotion: how long the gate waits; then the iteration continues without human scores.",
    )


class TrackingParams(Section):
    uri: Optional[str] = Field(
        None, description="MLflow tracking URI; default sqlite:///<workspace>/mlflow.db. MLFLOW_TRACKING_URI overrides."
    )
    experiment: str = Field("closedloop", description="MLflow experiment the runs are logged to.")
    registered_model: str = Field(
        "closedloop-policy", description="MLflow registered model the versions are registered under.",
    )
    log_weights: bool = Field(
        False, description="Also log each model version's weights to MLflow in full (transformers flavor); "
        "by default a version holds only a reference to its DVC-tracked folder.",
    )


class VersioningParams(Section):
    push: bool = Field(True, description="dvc push every batch and model to the default DVC remote.")
    save_experiments: bool = Field(True, description="Save each iteration as a DVC experiment ref.")


class RayParams(Section):
    address: str = Field(
        "", description="Ray cluster to run shards on ('ray://head:10001', 'auto', 'host:6379'); empty: the "
        "one this process is already connected to (prefect-ray's), else Ray's default (RAY_ADDRESS, a cluster "
        "`ray start` began on this machine, or a new local Ray for the stage).",
    )
    workers: int = Field(2, ge=1, description="Ray actors a sharded stage starts (each its own sampler or sandbox pools).")
    num_cpus: float = Field(1.0, ge=0.0, description="CPUs each sampling or reward actor asks for.")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs each sampling actor asks for (reward actors ask for none).")
    train_num_cpus: float = Field(1.0, ge=0.0, description="CPUs the training task asks for.")
    train_num_gpus: float = Field(0.0, ge=0.0, description="GPUs the training task asks for.")
    retries: int = Field(2, ge=0, description="How often a shard whose worker was lost (killed, node gone) is run again.")
    placement_timeout_s: float = Field(
        120.0, gt=0, description="How long a stage waits for its Ray actors to be placed (their processes "
        "running) before it fails, naming the resources they asked for and what the cluster has. Building each "
        "actor's worker (loading the model) is waited for after that, with no deadline.",
    )


class ExecutionParams(Section):
    backend: Literal["local", "ray"] = Field(
        "local", description="Where shards run: local (this machine, in the stage's process and its sandbox "
        "pools) or ray (Ray actors and tasks on execution.ray.address). Results are the same on both.",
    )
    shards: int = Field(
        1, ge=1, description="Shards the sample stage cuts its tasks into, and the reward stage each "
        "environment's verifications into; samples and rewards do not depend on it.",
    )
    ray: RayParams = RayParams()


