"""The DVC pipeline, defined once: dvc.yaml, the Prefect tasks and the iteration flow are built from this table.

Each stage lists exactly what it reads: its data inputs, its code, and the dotted params keys. A stage's
code is derived, not written: the closedloop modules its stage module imports, transitively (see
``stage_code``). A test checks the committed dvc.yaml is this rendering.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from closedloop import workspace as ws
from closedloop.reports import plots
from closedloop.stage_files import info_path, metrics_path, timing_path

PACKAGE = "closedloop"
# Loaded by run_stage by name, for the stages that draw plots only: as a literal import in
# stages/common.py it would be code of every stage, and an edit to a plot would rerun the warm start.
PLOTS_MODULE = f"{PACKAGE}.reports.plots"
# The params schema, loaded by run_stage by name for the stages that read params (all but promote): a
# stage that reads none runs without params.yaml, and an edit to the schema does not rerun it.
CONFIG_MODULE = f"{PACKAGE}.config"


@dataclass(frozen=True)
class StageSpec:
    name: str
    deps: tuple[str, ...]  # data inputs, relative to the workspace
    params: tuple[str, ...]
    outs: tuple[str, ...]
    module: str = ""  # the stage module whose run() is the stage; closedloop.stages.<name> unless given
    # Plot files (closedloop/reports/plots.py) run_stage writes after the stage, from the stage's own files.
    plots: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.module:
            object.__setattr__(self, "module", f"{PACKAGE}.stages.{self.name}")

    @property
    def code(self) -> tuple[str, ...]:
        """The .py files the stage runs, relative to the package: derived from its imports, and from
        those of the modules run_stage loads by name for it (the params schema for a stage that reads
        params, the plots for one that draws plots)."""
        loaded = [module for module, used in ((CONFIG_MODULE, self.params), (PLOTS_MODULE, self.plots)) if used]
        return tuple(sorted(set(stage_code(self.module)).union(*(stage_code(module) for module in loaded))))

    @property
    def metrics(self) -> tuple[str, ...]:
        """Its metrics files: the numbers it returned, and its timing apart (closedloop/stage_files.py)."""
        return (metrics_path(self.name), timing_path(self.name))

    @property
    def files(self) -> tuple[str, ...]:
        """The small git-tracked outs beside its data: what it said that is not a number, and its plots."""
        return (info_path(self.name), *self.plots)


SAMPLING_KEYS = ("sample.temperature", "sample.top_p", "sample.max_new_tokens", "sample.stop",
                 "sample.settings_mismatch", "sample.prompt_format", "sample.system_prompt")
# What runs a model: the backend and its server, and the model's device and dtype (numerics differ).
# model.name_or_path decides what prompt_format auto means.
MODEL_KEYS = ("model.name_or_path", "model.device", "model.dtype")
INFERENCE_KEYS = ("sample.backend", "sample.server", *MODEL_KEYS)
SANDBOX_KEYS = ("reward.workers",)  # the limits and isolation are under envs.<name>.sandbox

STAGES: tuple[StageSpec, ...] = (
    StageSpec(
        "benchmark", (),
        ("project.seed", "envs"), (ws.BENCHMARK_TASKS,),
    ),
    StageSpec(
        "warmstart", (ws.BENCHMARK_TASKS,),
        ("project.seed", "model", "warmstart", "envs", "evaluate", "train.lora", "train.mixed_precision", *SAMPLING_KEYS,
         "sample.backend", "sample.server", *SANDBOX_KEYS),
        (ws.REFERENCES, ws.WARMSTART_MODEL, ws.WARMSTART_EVAL),
    ),
    StageSpec(
        "generate", (),
        ("project.seed", "loop.iteration", "generate", "envs"), (ws.TASKS,),
    ),
    StageSpec(
        "sample", (ws.TASKS, ws.CHAMPION),
        ("project.seed", "loop.iteration", "sample", *MODEL_KEYS), (ws.SAMPLES, ws.SAMPLE_TIMINGS, ws.ROLLOUTS),
    ),
    StageSpec(
        # The labels and known hacks always exist (close_loop creates them empty): the human component,
        # and the reward hacks every verifier version must fail, re-checked here for the gate.
        # The benchmark canary: its first tasks' references and blank answers under today's verifiers.
        "reward", (ws.TASKS, ws.SAMPLES, ws.HUMAN_LABELS, ws.KNOWN_HACKS, ws.BENCHMARK_TASKS),
        ("reward", "envs", "monitors.canary_per_env"), (ws.REWARDS, ws.KNOWN_HACKS_CHECK, ws.CANARY_CHECK),
    ),
    StageSpec(
        # The review sample is drawn here, seeded per iteration; review.timeout_s is not its concern.
        "grade", (ws.TASKS, ws.SAMPLES, ws.REWARDS),
        ("project.seed", "loop.iteration", "grade", "review.mode", "review.size", "review.strata",
         "train.include_fix_pairs", "train.max_fix_fraction"),
        (ws.GRADED, ws.FIXES, ws.TRAIN_SET, ws.REVIEW_SAMPLE), plots=(plots.REWARDS, plots.BUCKETS_FILE),
    ),
    StageSpec(
        "validate", (ws.TASKS, ws.GRADED, ws.FIXES),
        ("sample.k",), (ws.VALIDATION_DIR,),
    ),
    StageSpec(
        # The validation report is an input: training never starts on a batch that failed validation.
        # grpo trains on every sample (rewards, tokens, log-probabilities), rft on the train set.
        # grpo's on-policy rounds sample and score as the sample and reward stages do: their settings,
        # the human labels and the sandbox are the train stage's too, and the rounds' samples its output.
        "train",
        (ws.TRAIN_SET, ws.REFERENCES, ws.CHAMPION, ws.VALIDATION_DIR, ws.TASKS, ws.SAMPLES, ws.REWARDS,
         ws.ROLLOUTS, ws.HUMAN_LABELS),
        ("project.seed", "loop.iteration", "train", *SAMPLING_KEYS, "sample.k", "sample.batch_size", *INFERENCE_KEYS,
         "reward", "envs"),
        (ws.CANDIDATE, ws.TRAIN_ROUNDS),
    ),
    StageSpec(
        "evaluate",
        (ws.BENCHMARK_TASKS, ws.CHAMPION, ws.CANDIDATE),
        # The gate's rule picks the groups measured again (gate.confirm_samples), so it is evaluate's too.
        ("project.seed", "loop.iteration", "evaluate", "envs", *SAMPLING_KEYS, *INFERENCE_KEYS, *SANDBOX_KEYS,
         "gate.slice_tolerance", "gate.noise_z", "gate.confirm_samples"),
        (ws.EVALUATION,), plots=(plots.BENCHMARK, plots.HISTORY),
    ),
    StageSpec(
        # Versioned checks over this batch and the previous iterations' (monitors.versions, read through
        # DVC at their experiments). The train stage's figures are git-tracked files (its metrics and
        # info), deps like any other: GRPO health reads them.
        "monitors",
        (ws.SAMPLES, ws.REWARDS, ws.ROLLOUTS, ws.EVALUATION, ws.CANARY_CHECK, metrics_path("train"),
         info_path("train")),
        ("loop.iteration", "monitors"), (ws.MONITORS_REPORT,),
    ),
    StageSpec(
        # The candidate: its closedloop_training.json says whether it trained at all.
        # The known-hacks check: a known hack today's verifier scores above 0 holds promotion.
        # The monitors report: a failing monitor named in monitors.block_promotion holds it too.
        "gate", (ws.EVALUATION, ws.CANDIDATE, ws.KNOWN_HACKS_CHECK, ws.REVIEW_OUTCOME, ws.MONITORS_REPORT),
        ("gate", "monitors.block_promotion"), (ws.GATE,),
    ),
    StageSpec(
        "promote", (ws.GATE, ws.CHAMPION, ws.CANDIDATE), (), (ws.NEXT_CHAMPION,),
    ),
)

STAGE_NAMES = tuple(stage.name for stage in STAGES)
WARM_START_STAGES = ("benchmark", "warmstart")
ITERATION_STAGES = tuple(name for name in STAGE_NAMES if name not in WARM_START_STAGES)


@dataclass(frozen=True)
class FlowStep:
    """A step of the iteration flow that is not a DVC stage (its record is a file another stage reads,
    `dvc add`ed by the step itself), run before ``before`` when ``wanted`` says params.yaml asks for it."""

    name: str
    before: str
    wanted: Callable[[Any], bool]  # Params -> bool
    when: str  # the same condition in params.yaml's words, for people (the deployment's description)


FLOW_STEPS: tuple[FlowStep, ...] = (
    # People review this batch's review sample; their answers are the gate's input (review.json).
    FlowStep("review", before="gate", wanted=lambda params: params.review.mode == "before_promotion",
             when="review.mode: before_promotion"),
)


def iteration_steps(params: Any) -> tuple[str, ...]:
    """The iteration flow's steps in order: the iteration stages, with the flow steps params ask for."""
    steps: list[str] = []
    for stage in ITERATION_STAGES:
        steps += [step.name for step in FLOW_STEPS if step.before == stage and step.wanted(params)]
        steps.append(stage)
    return tuple(steps)


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


# Edges the import walk cannot see: the sandbox worker is started as a script by path, and it loads
# child.py and jail.py by path (it never imports closedloop), yet they decide every sandboxed verdict.
RUN_BY_PATH: dict[str, tuple[str, ...]] = {
    "closedloop.sandbox.isolation": ("closedloop.sandbox.worker",),
    "closedloop.sandbox.worker": ("closedloop.sandbox.child", "closedloop.sandbox.jail"),
}
# Imported by every stage (stage_function looks the module up here) but not code a stage's outputs
# depend on: DVC already sees every change to the table that matters through dvc.yaml, its rendering.
# As a code dep it would make any edit to this file rerun every stage, warm start included.
NOT_STAGE_CODE = frozenset({"closedloop.pipeline"})
# A registry entry ("closedloop.envs.code:CodeEnv"): a module imported by name when it is looked up.
_ENTRY = re.compile(rf"{PACKAGE}(?:\.\w+)+:\w+")


def module_file(module: str) -> Path | None:
    """The file of a closedloop module or package, None for anything else (a name, another package)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or not all(part.isidentifier() for part in parts):
        return None
    base = package_dir().joinpath(*parts[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _runtime_nodes(tree: ast.AST):
    """Every node, anywhere (imports inside functions are the lazily loaded code the stage runs), except
    the bodies of ``if TYPE_CHECKING:``, which never run."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


@lru_cache(maxsize=None)
def imported_modules(module: str) -> frozenset[str]:
    """The closedloop modules ``module``'s source imports, read with ast (nothing is imported):
    ``import a.b``, ``from a import b`` (b a submodule or a name), relative imports, registry entries."""
    path = module_file(module)
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set(RUN_BY_PATH.get(module, ()))
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENTRY.fullmatch(node.value):
            found.add(node.value.partition(":")[0])
    return frozenset(name for name in found if module_file(name) is not None)


@lru_cache(maxsize=None)
def stage_code(module: str) -> tuple[str, ...]:
    """The .py files (relative to the package, sorted) that importing ``module`` runs: its imports,
    transitively, and the package __init__ files Python runs on the way."""
    if module_file(module) is None:
        raise ValueError(f"stage module {module!r} is not a module of the {PACKAGE} package")
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_STAGE_CODE:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # the packages above it
        todo.extend(imported_modules(name))
    root = package_dir()
    return tuple(sorted(module_file(name).relative_to(root).as_posix() for name in seen if not _no_code(name)))


@lru_cache(maxsize=None)
def _no_code(module: str) -> bool:
    """A package's __init__ that holds a docstring alone: Python runs it on the way, but no edit to it
    can change what a stage computes, so it is no stage's code dependency (one with code is)."""
    path = module_file(module)
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text(), filename=str(path)).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def render(prefix: str) -> dict:
    stages = {}
    for stage in STAGES:
        entry: dict = {"cmd": f"closedloop stage {stage.name}"}
        entry["deps"] = [f"{prefix}/{path}" for path in stage.code] + list(stage.deps)
        if stage.params:
            entry["params"] = list(stage.params)
        # Small files under metrics/ are kept by git with each experiment, not by DVC's cache.
        entry["outs"] = list(stage.outs) + [
            {path: {"cache": False, **({"persist": True} if path in plots.PERSISTENT else {})}}
            for path in stage.files]
        entry["metrics"] = [{path: {"cache": False}} for path in stage.metrics]
        stages[stage.name] = entry
    return {"stages": stages, "plots": [{title: dict(spec)} for title, spec in plots.DEFINITIONS]}


def render_yaml(prefix: str) -> str:
    import yaml

    header = (
        "# Rendered from closedloop/pipeline.py by `closedloop init`; edit that table, not this file.\n"
        "# Each stage runs `closedloop stage <name>`, the same function the Prefect task runs.\n"
    )
    return header + yaml.safe_dump(render(prefix), sort_keys=False, width=120)
