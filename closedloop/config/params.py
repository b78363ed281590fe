"""The whole of params.yaml (:class:`Params`), parsing it with errors that name the key, and laying
a caller's settings over it."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError, model_validator

from closedloop.config.base import PARAMS_FILE, Section
from closedloop.config.envs import EnvsParams, GenerateParams, GradeParams, RewardParams
from closedloop.config.loop import (
    ExecutionParams,
    GateParams,
    LoopParams,
    MonitorsParams,
    ProjectParams,
    ReviewParams,
    TrackingParams,
    VersioningParams,
)
from closedloop.config.model import EvaluateParams, ModelParams, SampleParams
from closedloop.config.training import TrainParams, WarmstartParams
from closedloop.nested import deep_merge


class Params(Section):
    project: ProjectParams = ProjectParams()
    loop: LoopParams = LoopParams()
    model: ModelParams = ModelParams()
    envs: EnvsParams = EnvsParams()
    generate: GenerateParams = GenerateParams()
    sample: SampleParams = SampleParams()
    reward: RewardParams = RewardParams()
    grade: GradeParams = GradeParams()
    warmstart: WarmstartParams = WarmstartParams()
    train: TrainParams = TrainParams()
    evaluate: EvaluateParams = EvaluateParams()
    monitors: MonitorsParams = MonitorsParams()
    gate: GateParams = GateParams()
    review: ReviewParams = ReviewParams()
    tracking: TrackingParams = TrackingParams()
    versioning: VersioningParams = VersioningParams()
    execution: ExecutionParams = ExecutionParams()

    @model_validator(mode="after")
    def _combinations_that_work(self) -> "Params":
        # Refused here, at load, rather than in the train stage after sampling and reward have run.
        if self.train.mode == "grpo" and self.sample.temperature == 0:
            raise ValueError("train.mode is grpo but sample.temperature is 0: greedy samples of a task are "
                             "identical, so no group has a reward spread to learn from")
        if self.sample.backend.name == "vllm" and self.model.device == "cpu":
            raise ValueError("sample.backend is vllm but model.device is cpu: vLLM samples on GPUs; "
                             "use the hf backend on CPU, or model.device auto | cuda")
        if self.sample.rounds > 1 and self.train.mode == "grpo" and self.train.grpo.rounds > 1:
            raise ValueError(f"sample.rounds is {self.sample.rounds} and train.grpo.rounds is {self.train.grpo.rounds}: "
                             "the train stage's on-policy rounds sample single attempts, not episodes; "
                             "set one of them to 1")
        unknown = sorted(set(self.generate.envs) - set(self.envs.active()))
        if unknown:
            raise ValueError(f"generate.envs: {unknown} are not active environments; expected names from "
                             f"{self.envs.active()} (an environment with share 0 takes no part in the loop)")
        if self.train.micro_batch_size > self.train.batch_size:
            raise ValueError(f"train.micro_batch_size ({self.train.micro_batch_size}) must not exceed "
                             f"train.batch_size ({self.train.batch_size})")
        return self

    def stage_seed(self, stage: str, per_iteration: bool = True) -> int:
        """A seed per stage (and per iteration unless ``per_iteration`` is False), so no two stages
        share a random stream and each iteration draws new training tasks."""
        iteration = self.loop.iteration if per_iteration else 0
        return (self.project.seed * 1_000_003 + iteration * 7919 + zlib.crc32(stage.encode())) % 2**31


class ConfigError(ValueError):
    """params.yaml is missing, unreadable, or does not match the schema."""


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        else:
            got = item.get("input")
            got_text = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"  {key}: {item['msg']}{got_text}")
    return "\n".join(lines)


def parse_params(data: object, source: str = PARAMS_FILE) -> Params:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(data).__name__}")
    try:
        return Params.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, source)) from None


def given_settings(given: Params, baseline: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings a caller actually gave, as a nested dict: the keys set explicitly in ``given``
    (pydantic's fields-set, so a partial ``{"train": {"steps": 12}}`` is one key, not every default),
    less those equal to ``baseline``.

    ``baseline`` is what the caller's form started from (a deployment's default parameters, a
    snapshot of params.yaml taken when it was served): a value left as the form showed it is not a
    wish to change the workspace, which may have moved on since (the loop bumps loop.iteration)."""
    wanted = given.model_dump(mode="json", exclude_unset=True)
    return _changed(wanted, baseline) if baseline is not None else wanted


def _changed(wanted: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in wanted.items():
        before = baseline.get(key, _MISSING) if isinstance(baseline, Mapping) else _MISSING
        if isinstance(value, dict) and isinstance(before, Mapping):
            nested = _changed(value, before)
            if nested:
                out[key] = nested
        elif value != before:
            out[key] = value
    return out


_MISSING = object()


def merge_settings(base: Params, settings: Mapping[str, Any], source: str) -> Params:
    """``base`` with ``settings`` (a nested dict, possibly partial) laid over it, validated as a whole:
    a bad value fails here, with ``source`` and the key named, before anything is written."""

    return parse_params(deep_merge(base.model_dump(mode="json"), settings), source)

