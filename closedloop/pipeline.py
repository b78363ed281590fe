"""The DVC pipeline, defined once: dvc.yaml is rendered from this table.

Each stage lists exactly what it reads: its data inputs, its own code, and the dotted params keys.
Rendering from one table keeps dvc.yaml, the Prefect flow and the stage functions in agreement; a
test checks the committed dvc.yaml is this rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from closedloop import workspace as ws

# Code every stage runs through: the config schema, the stage runner and the batch-file helpers.
COMMON_CODE = ("config.py", "io.py", "workspace.py", "stages/common.py")


@dataclass(frozen=True)
class StageSpec:
    name: str
    code: tuple[str, ...]  # paths relative to the closedloop package
    deps: tuple[str, ...]  # data inputs, relative to the workspace
    params: tuple[str, ...]
    outs: tuple[str, ...]
    metrics: tuple[str, ...] = field(default=())


SAMPLING_KEYS = ("sample.temperature", "sample.top_p", "sample.max_new_tokens", "sample.stop",
                 "sample.settings_mismatch", "sample.prompt_format", "sample.system_prompt")
# What runs a model: the backend and its server, and the model's device and dtype (numerics differ).
# model.name_or_path decides what prompt_format auto means.
MODEL_KEYS = ("model.name_or_path", "model.device", "model.dtype")
INFERENCE_KEYS = ("sample.backend", "sample.server", *MODEL_KEYS)
SANDBOX_KEYS = ("reward.workers",)  # the limits and isolation are under envs.<name>.sandbox

STAGES: tuple[StageSpec, ...] = (
    StageSpec(
        "benchmark", ("stages/benchmark.py", "envs", "rewards/validators.py"), (),
        ("project.seed", "envs"), (ws.BENCHMARK_TASKS,),
    ),
    StageSpec(
        "warmstart",
        ("stages/warmstart.py", "envs", "rewards/validators.py", "models", "training", "sampling", "evaluation",
         "sandbox"),
        (ws.BENCHMARK_TASKS,),
        ("project.seed", "model", "warmstart", "envs", "evaluate", "train.lora", *SAMPLING_KEYS,
         "sample.backend", "sample.server", *SANDBOX_KEYS),
        (ws.REFERENCES, ws.WARMSTART_MODEL, ws.WARMSTART_EVAL),
    ),
    StageSpec(
        "generate", ("stages/generate.py", "envs", "rewards/validators.py"), (),
        ("project.seed", "loop.iteration", "generate", "envs"), (ws.TASKS,),
    ),
    StageSpec(
        "sample", ("stages/sample.py", "sampling", "models"), (ws.TASKS, ws.CHAMPION),
        ("project.seed", "loop.iteration", "sample", *MODEL_KEYS), (ws.SAMPLES, ws.SAMPLE_TIMINGS, ws.ROLLOUTS),
    ),
    StageSpec(
        "reward", ("stages/reward.py", "envs", "sandbox", "rewards"), (ws.TASKS, ws.SAMPLES),
        ("reward", "envs"), (ws.REWARDS,),
    ),
    StageSpec(
        "grade", ("stages/grade.py", "grading.py"), (ws.TASKS, ws.SAMPLES, ws.REWARDS),
        ("grade", "train.include_fix_pairs", "train.max_fix_fraction"),
        (ws.GRADED, ws.FIXES, ws.TRAIN_SET),
    ),
    StageSpec(
        "validate", ("stages/validate.py", "lineage/validation.py"), (ws.TASKS, ws.GRADED, ws.FIXES),
        ("sample.k",), (ws.VALIDATION_DIR,),
    ),
    StageSpec(
        # The validation report is an input: training never starts on a batch that failed validation.
        # grpo trains on every sample (rewards, tokens, log-probabilities), rft on the train set.
        "train", ("stages/train.py", "training", "models", "rewards/shaping.py", "lineage/dvc.py"),
        (ws.TRAIN_SET, ws.REFERENCES, ws.CHAMPION, ws.VALIDATION_DIR, ws.TASKS, ws.SAMPLES, ws.REWARDS,
         ws.ROLLOUTS),
        ("project.seed", "loop.iteration", "train", *SAMPLING_KEYS, *MODEL_KEYS), (ws.CANDIDATE,),
    ),
    StageSpec(
        "evaluate", ("stages/evaluate.py", "evaluation", "sampling", "models", "envs", "rewards/validators.py", "sandbox"),
        (ws.BENCHMARK_TASKS, ws.CHAMPION, ws.CANDIDATE),
        ("project.seed", "loop.iteration", "evaluate", "envs", *SAMPLING_KEYS, *INFERENCE_KEYS, *SANDBOX_KEYS),
        (ws.EVALUATION,),
    ),
    StageSpec(
        # The candidate: its closedloop_training.json says whether it trained at all.
        "gate", ("stages/gate.py", "evaluation/gate.py"), (ws.EVALUATION, ws.CANDIDATE), ("gate",), (ws.GATE,),
    ),
    StageSpec(
        "promote", ("stages/promote.py",), (ws.GATE, ws.CHAMPION, ws.CANDIDATE), (), (ws.NEXT_CHAMPION,),
    ),
)

STAGE_NAMES = tuple(stage.name for stage in STAGES)
WARM_START_STAGES = ("benchmark", "warmstart")
ITERATION_STAGES = tuple(name for name in STAGE_NAMES if name not in WARM_START_STAGES)


def stage_spec(name: str) -> StageSpec:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGE_NAMES)}")


def package_dir() -> Path:
    return Path(__file__).resolve().parent


def code_prefix(workspace: Path) -> str:
    """How dvc.yaml names the package: relative when it lives in the workspace (this repository),
    absolute otherwise (an installed closedloop serving a user's own workspace)."""
    package = package_dir()
    try:
        return str(package.relative_to(Path(workspace).resolve()))
    except ValueError:
        return str(package)


def code_files(paths: tuple[str, ...]) -> list[str]:
    """Package paths expanded to their .py files: a directory dep would also hash __pycache__."""
    root = package_dir()
    files: list[str] = []
    for path in paths:
        target = root / path
        found = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        for file in found:
            relative = file.relative_to(root).as_posix()
            if relative not in files:
                files.append(relative)
    return files


def render(prefix: str) -> dict:
    stages = {}
    for stage in STAGES:
        entry: dict = {"cmd": f"closedloop stage {stage.name}"}
        entry["deps"] = [f"{prefix}/{path}" for path in code_files((*COMMON_CODE, *stage.code))] + list(stage.deps)
        if stage.params:
            entry["params"] = list(stage.params)
        entry["outs"] = list(stage.outs)
        entry["metrics"] = [{f"metrics/{stage.name}.json": {"cache": False}}]
        stages[stage.name] = entry
    return {"stages": stages}


def render_yaml(prefix: str) -> str:
    import yaml

    header = (
        "# Rendered from closedloop/pipeline.py by `closedloop init`; edit that table, not this file.\n"
        "# Each stage runs `closedloop stage <name>`, the same function the Prefect task runs.\n"
    )
    return header + yaml.safe_dump(render(prefix), sort_keys=False, width=120)
