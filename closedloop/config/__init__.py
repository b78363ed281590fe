"""The typed schema of params.yaml, the project's one config file.

Every section mirrors one stage of the DAG. Unknown keys and wrong types are errors whose message
names the dotted key (``sample.k``) and the file, so a typo never silently falls back to a default.
The flows take :class:`Params` as a parameter, which is what gives the Prefect UI its form.

The sections live by concept: model.py (the policy, sampling and evaluation), envs.py (environments,
their sandbox limits, generation, rewards and grading), training.py (train and warm start), loop.py
(seed and iteration, monitors, gate, review, tracking, versioning, execution); params.py holds the
whole and its parsing, files.py reading and writing params.yaml. docs/configuration-reference.md is
generated from them (``python -m closedloop.config.reference``).
"""

from closedloop.config.base import PARAMS_FILE
from closedloop.config.envs import (
    BUILTIN_ENVS,
    CodeEnvParams,
    CustomEnvParams,
    CustomSliceSizes,
    DataEnvParams,
    EnvParams,
    EnvsParams,
    ExtractEnvParams,
    FeedbackSourceParams,
    GenerateParams,
    GradeParams,
    HumanSourceParams,
    RewardParams,
    RulesEnvParams,
    SandboxParams,
    ScriptEnvParams,
    SliceSizes,
)
from closedloop.config.files import default_params_yaml, load_params, write_params
from closedloop.config.loop import (
    ExecutionParams,
    GateParams,
    LoopParams,
    MonitorsParams,
    MonitorThreshold,
    ProjectParams,
    RayParams,
    ReviewParams,
    ReviewStrata,
    TrackingParams,
    VersioningParams,
)
from closedloop.config.model import (
    BuiltinModelParams,
    EvaluateParams,
    HfBackendParams,
    ModelParams,
    OpenAIBackendParams,
    SampleBackend,
    SampleParams,
    SamplingSettings,
    ServerParams,
    VllmBackendParams,
)
from closedloop.config.params import ConfigError, Params, given_settings, merge_settings, parse_params
from closedloop.config.training import (
    GrpoParams,
    LoraParams,
    ReplayParams,
    ShapingParams,
    TrainParams,
    WarmstartParams,
)
from closedloop.monitor_catalog import MONITOR_NAMES, WARN_ONLY_MONITORS

__all__ = [
    "BUILTIN_ENVS", "MONITOR_NAMES", "PARAMS_FILE", "WARN_ONLY_MONITORS",
    "BuiltinModelParams", "CodeEnvParams", "ConfigError", "CustomEnvParams", "CustomSliceSizes", "DataEnvParams",
    "EnvParams", "EnvsParams", "EvaluateParams", "ExecutionParams", "ExtractEnvParams", "FeedbackSourceParams",
    "GateParams", "GenerateParams", "GradeParams", "GrpoParams", "HfBackendParams", "HumanSourceParams",
    "LoopParams", "LoraParams", "ModelParams", "MonitorThreshold", "MonitorsParams", "OpenAIBackendParams",
    "Params", "ProjectParams", "RayParams", "ReplayParams", "ReviewParams", "ReviewStrata", "RewardParams",
    "RulesEnvParams", "SampleBackend", "SampleParams", "SamplingSettings", "SandboxParams", "ScriptEnvParams",
    "ServerParams", "ShapingParams", "SliceSizes", "TrackingParams", "TrainParams", "VersioningParams",
    "VllmBackendParams", "WarmstartParams",
    "default_params_yaml", "given_settings", "load_params", "merge_settings", "parse_params", "write_params",
]
