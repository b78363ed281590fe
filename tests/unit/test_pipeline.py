"""The one stage table: dvc.yaml is its rendering, the Prefect tasks and the stage modules agree with it,
and each stage's code deps are derived from what its module imports."""

import ast
import importlib
from collections import Counter
from pathlib import Path

import pytest
import yaml

from closedloop.config import ConfigError, Params
from closedloop.io import write_json
from closedloop.pipeline import (
    CONFIG_MODULE,
    ITERATION_STAGES,
    STAGE_NAMES,
    STAGES,
    WARM_START_STAGES,
    imported_modules,
    iteration_steps,
    module_file,
    render,
    render_yaml,
    stage_code,
    stage_spec,
)
from closedloop.stages.common import run_stage
from closedloop.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "closedloop"


def test_committed_dvc_yaml_is_the_rendering():
    assert (ROOT / "dvc.yaml").read_text() == render_yaml("closedloop"), (
        "dvc.yaml is stale (the table or a stage's imports changed): write render_yaml('closedloop') to it, "
        "as `closedloop init` does"
    )


def test_every_stage_module_has_exactly_one_stage():
    modules = Counter(spec.module for spec in STAGES)
    # Not stages: the runner, and helpers imported only by the stages (or callers) that use them, so
    # that they are code deps of those stages alone.
    helpers = ("__init__.py", "common.py", "onpolicy.py", "prompting.py", "recorded.py")
    files = sorted(path.stem for path in (PACKAGE / "stages").glob("*.py") if path.name not in helpers)
    assert {module: count for module, count in modules.items() if count != 1} == {}
    assert sorted(modules) == [f"closedloop.stages.{stem}" for stem in files]


@pytest.mark.parametrize("spec", STAGES, ids=lambda spec: spec.name)
def test_every_stage_module_has_a_run_function_and_the_runner_finds_it(spec):
    from closedloop.stages.common import stage_function

    module = importlib.import_module(spec.module)
    assert callable(getattr(module, "run", None)), f"{spec.module} has no run()"
    assert stage_function(spec.name) is module.run


def test_prefect_tasks_are_the_table_in_order():
    import tasks.stages

    assert list(tasks.stages.STAGE_TASKS) == list(STAGE_NAMES)
    for name, task in tasks.stages.STAGE_TASKS.items():
        assert task.name == name
        assert (task.retries, task.persist_result) == (0, False)
        assert getattr(tasks.stages, name) is task  # existing callers use stages.<name>


def test_iteration_is_the_table_after_the_warm_start():
    assert STAGE_NAMES[:len(WARM_START_STAGES)] == WARM_START_STAGES  # the warm start runs first
    assert STAGE_NAMES == WARM_START_STAGES + ITERATION_STAGES


def test_every_stage_runs_its_own_command_and_its_deps_exist():
    stages = render("closedloop")["stages"]
    assert list(stages) == list(STAGE_NAMES)
    for spec in STAGES:
        entry = stages[spec.name]
        assert entry["cmd"] == f"closedloop stage {spec.name}"
        for dep in entry["deps"]:
            if dep.startswith("closedloop/"):
                assert (ROOT / dep).is_file(), f"stage {spec.name} depends on missing {dep}"


def _direct_imports(module: str) -> set[str]:
    """The closedloop files a module's source names in an import statement, found independently of the
    pipeline's walker: `import a.b`, `from a import b` (b a submodule or a name in a)."""
    names = set()
    for node in ast.walk(ast.parse(module_file(module).read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    files = set()
    for name in names:
        if name.startswith("closedloop."):
            base = ROOT.joinpath(*name.split("."))
            files.update(str(path.relative_to(PACKAGE)) for path in (base.with_suffix(".py"), base / "__init__.py")
                         if path.is_file())
    return files


@pytest.mark.parametrize("spec", STAGES, ids=lambda spec: spec.name)
def test_code_deps_include_the_stage_module_and_what_it_imports(spec):
    own = str(module_file(spec.module).relative_to(PACKAGE))
    assert own in spec.code
    assert set(_direct_imports(spec.module)) - {"pipeline.py"} <= set(spec.code)
    # What every stage runs through: the stage runner and the batch-file helpers; the config schema too
    # where the stage reads params (promote reads none).
    assert {"io.py", "workspace.py", "stages/common.py"} <= set(spec.code)
    assert ("config/__init__.py" in spec.code) == bool(spec.params)
    assert "__init__.py" not in spec.code and "stages/__init__.py" not in spec.code  # docstrings alone
    assert list(spec.code) == sorted(set(spec.code))


@pytest.mark.parametrize("stage, file, expected", [
    ("reward", "sandbox/pool.py", True),  # reward runs the sandbox (a lazy import inside a function)
    ("reward", "sandbox/worker.py", True),  # started by path, not imported
    ("reward", "sandbox/child.py", True),  # loaded by path by the worker
    ("reward", "envs/code.py", True),  # a registry entry "closedloop.envs.code:CodeEnv"
    ("sample", "sampling/vllm_backend.py", True),  # a backend registry entry
    ("train", "training/grpo.py", True),
    ("grade", "training/grpo.py", False),  # grading never trains
    ("gate", "sampling/vllm_backend.py", False),  # the gate reads the evaluation, it never samples
    ("warmstart", "training/grpo.py", False),  # the warm start fine-tunes with sft only
    ("sample", "models/builtin.py", False),  # the builtin policy is built by the warm start alone
    ("promote", "lineage/tracking.py", False),  # MLflow is recorded by the flows, not by the stages
    ("train", "pipeline.py", False),  # the table reaches DVC through dvc.yaml, not as code
    # Only what a stage reads: an edit to the sandbox, the DVC adapter or the prompt format must not
    # make `dvc repro` rerun a stage that never uses it.
    ("promote", "sandbox/pool.py", False),  # promote moves an alias, it runs no code
    ("promote", "lineage/dvc/workspace.py", False),  # a stage is recorded by its caller (stages/recorded.py)
    ("validate", "rewards/pools.py", False),
    ("monitors", "models/prompts.py", False),
    ("sample", "models/settings.py", True),  # sample checks the champion's sampling settings
    ("warmstart", "rewards/pools.py", True),  # the warm start verifies its references
])
def test_code_deps_by_example(stage, file, expected):
    assert (file in stage_spec(stage).code) is expected


def test_type_checking_imports_are_not_followed_and_registry_entries_are():
    found = imported_modules("closedloop.envs")
    assert "closedloop.config" not in found  # imported under `if TYPE_CHECKING:` only
    assert {"closedloop.envs.code", "closedloop.envs.rules"} <= found


def test_params_keys_exist_in_the_schema():
    data = Params().model_dump()
    for spec in STAGES:
        for key in spec.params:
            node = data
            for part in key.split("."):
                assert part in node, f"stage {spec.name} lists params key {key} the schema lacks"
                node = node[part]


def test_every_input_is_produced_earlier_or_is_the_champion():
    # close_loop records these inputs before the first stage: the champion, and what people said (the
    # labels, and this iteration's review outcome, which the flow records again before the gate).
    produced = {"data/champion", "data/labels/human.jsonl", "data/labels/known_hacks.jsonl", "data/reports/review.json"}
    for spec in STAGES:
        for dep in spec.deps:
            assert dep in produced, f"{spec.name} reads {dep} before any stage writes it"
        produced.update(spec.outs, spec.metrics, spec.files)  # its git-tracked files too (monitors reads train's)


def test_root_params_yaml_is_valid():
    from closedloop.config import load_params

    load_params(ROOT)
    assert yaml.safe_load((ROOT / "params.yaml").read_text())


@pytest.mark.parametrize("spec", STAGES, ids=lambda spec: spec.name)
def test_every_stage_declares_its_metrics_timing_and_info_uncached(spec):
    entry = render("closedloop")["stages"][spec.name]
    assert entry["metrics"] == [{f"metrics/{spec.name}.json": {"cache": False}},
                                {f"metrics/timing/{spec.name}.json": {"cache": False}}]
    small = [out for out in entry["outs"] if isinstance(out, dict)]
    assert {f"metrics/info/{spec.name}.json": {"cache": False}} in small
    assert [next(iter(out)) for out in small] == [f"metrics/info/{spec.name}.json", *spec.plots]
    assert entry["outs"][:len(spec.outs)] == list(spec.outs)  # the data, in DVC's cache, as before


def test_plots_are_declared_top_level_and_written_by_the_stages_that_have_their_inputs():
    from closedloop.reports import plots

    rendered = render("closedloop")
    titles = [next(iter(item)) for item in rendered["plots"]]
    assert titles == [title for title, _ in plots.DEFINITIONS]
    owners = {path: spec.name for spec in STAGES for path in spec.plots}
    assert owners == {plots.BENCHMARK: "evaluate", plots.HISTORY: "evaluate", plots.REWARDS: "grade",
                      plots.BUCKETS_FILE: "grade"}
    history = [out for out in rendered["stages"]["evaluate"]["outs"] if isinstance(out, dict) and plots.HISTORY in out]
    # kept across iterations: DVC must not delete it before the evaluate stage reruns
    assert history == [{plots.HISTORY: {"cache": False, "persist": True}}]


@pytest.mark.parametrize("stage, drawn", [
    ("evaluate", True), ("grade", True),
    ("warmstart", False),  # an edit to a plot must not rerun the warm start
    ("train", False),
])
def test_the_plots_module_is_code_of_the_stages_that_draw_plots_only(stage, drawn):
    assert ("reports/plots.py" in stage_spec(stage).code) is drawn
    assert "stage_files.py" in stage_spec(stage).code  # every stage writes its files through it


def test_the_review_step_is_declared_in_the_table_and_runs_before_the_gate_only_when_asked():
    params = Params()
    assert iteration_steps(params) == ITERATION_STAGES  # review.mode off: the stages alone
    params.review.mode = "before_promotion"
    steps = iteration_steps(params)
    assert steps[steps.index("gate") - 1] == "review"
    assert [step for step in steps if step != "review"] == list(ITERATION_STAGES)


# How many files each stage's code dependencies hold (what an edit to reruns it under `dvc repro`). A
# count that grows means a stage now imports more than it did: raise it here only with a reason.
STAGE_CODE_COUNTS = {"benchmark": 44, "warmstart": 69, "generate": 44, "sample": 62, "reward": 62, "grade": 48,
                     "validate": 19, "train": 98, "evaluate": 67, "monitors": 41, "gate": 48, "promote": 8}


@pytest.mark.parametrize("spec", STAGES, ids=lambda spec: spec.name)
def test_no_stage_depends_on_more_code_than_stated(spec):
    assert len(spec.code) <= STAGE_CODE_COUNTS[spec.name], (
        f"stage {spec.name} now depends on {len(spec.code)} files (stated: {STAGE_CODE_COUNTS[spec.name]}): "
        f"{list(spec.code)}")


def test_promote_depends_on_the_runner_and_the_model_fingerprint_only():
    """promote reads no params: neither params.yaml nor the schema that validates it is its code."""
    own = {"stages/promote.py", "models/loading.py"}  # its module and model_fingerprint
    runner = {"stages/common.py", "stage_files.py", "faults.py", "io.py", "nested.py", "workspace.py"}
    assert set(stage_spec("promote").code) == own | runner


def test_a_stage_that_reads_params_has_the_schema_as_code_and_one_that_reads_none_runs_without_it(tmp_path):
    schema = set(stage_code(CONFIG_MODULE))
    assert {"config/params.py", "config/training.py", "sandbox_limits.py"} <= schema
    schema_alone = {path for path in schema if path != "nested.py"}  # nested.py: the runner's too
    for spec in STAGES:
        assert schema <= set(spec.code) if spec.params else not schema_alone & set(spec.code), spec.name
    # promote runs on a workspace whose params.yaml does not even parse: it reads none of it.
    (tmp_path / "params.yaml").write_text("model: [unclosed\n")
    ws = Workspace.at(tmp_path)
    write_json(ws.gate, {"promote": False})
    ws.champion.mkdir(parents=True)
    (ws.champion / "config.json").write_text("{}")
    result = run_stage("promote", tmp_path)
    assert result["promoted"] is False and (ws.next_champion / "config.json").read_text() == "{}"
    with pytest.raises(ConfigError, match="params.yaml: not valid YAML"):
        run_stage("gate", tmp_path)  # a stage that reads params still reads and validates them
