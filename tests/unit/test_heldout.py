"""The benchmark's heldout slice: families or compositions the train split never emits, so the loop's
gain on it is transfer to unseen work. Disjoint by construction: many training batches, none of whose
tasks falls in a held-out family, domain or composition."""

from __future__ import annotations

import re

import pytest

from closedloop.config import Params
from closedloop.envs import get_env
from closedloop.envs.base import HELDOUT, SLICES, TRAINED_SLICES

BUILTIN = ("code", "data", "extract", "rules", "script")
TRAIN_SEEDS = range(6)
TRAIN_BATCH = 300


def _held_out_marks(name: str):
    """What makes a task held out, read from the task alone (not from the generator's own predicate)."""
    if name == "code":  # the squares of xs sorted ascending, or their sum
        return lambda task: bool(re.search(r"(sorted\(x \* x for|sum\(x \* x for)", task.reference))
    if name == "rules":
        return lambda task: task.checks["spec"]["domain"] == "routing"
    if name == "extract":
        return lambda task: task.kind == "contract" or "agreement" in task.prompt or "will provide services" in task.prompt
    if name == "data":
        return lambda task: "pivot" in task.reference
    return lambda task: "for each file in" in task.prompt and "how many of its lines" in task.prompt


@pytest.fixture(scope="module")
def params():
    return Params()


@pytest.mark.parametrize("name", BUILTIN)
def test_no_training_batch_holds_a_heldout_task(name, params):
    env = get_env(name, params)
    held_out = env.generate(10, 0, "benchmark", HELDOUT)
    marked = _held_out_marks(name)
    assert len(held_out) == 10 and all(t.slice == HELDOUT and marked(t) for t in held_out)
    held_prompts = {t.prompt for t in held_out}
    for seed in TRAIN_SEEDS:
        batch = env.generate(TRAIN_BATCH, seed, "train")
        assert not [t.task_id for t in batch if marked(t)], f"{name}: seed {seed} trains on a held-out task"
        assert {t.slice for t in batch} <= set(TRAINED_SLICES)
        assert not held_prompts & {t.prompt for t in batch}


@pytest.mark.parametrize("name", BUILTIN)
def test_the_other_benchmark_slices_hold_no_heldout_task(name, params):
    """A held-out family is measured in its own slice only, so the in-distribution slices stay what
    the policy trained on and the two gains are reported apart."""
    env = get_env(name, params)
    marked = _held_out_marks(name)
    for slice in TRAINED_SLICES:
        tasks = env.generate(10, 0, "benchmark", slice)
        assert not [t.task_id for t in tasks if marked(t)], f"{name}/{slice} holds a held-out task"


def test_the_benchmark_has_a_heldout_slice_by_default(params):
    # Each environment's own tests verify every slice's references in the sandbox (they loop over SLICES).
    assert SLICES[-1] == HELDOUT
    assert params.envs.section("code").benchmark.heldout > 0


def test_a_transfer_run_generates_training_tasks_from_the_named_environments_alone(tmp_path):
    """generate.envs: the iteration's new training tasks from code alone; the benchmark keeps every
    environment, so the other four measure transfer."""
    import copy

    import yaml

    from closedloop.io import read_json, read_jsonl
    from closedloop.stages.common import run_stage
    from tests.tiny import TINY

    data = copy.deepcopy(TINY)
    data["generate"] = {"n_tasks": 12, "envs": ["code"]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    run_stage("generate", tmp_path)
    tasks = read_jsonl(tmp_path / "data/batch/tasks.jsonl")
    assert len(tasks) == 12 and {t["env"] for t in tasks} == {"code"}
    assert read_json(tmp_path / "metrics/generate.json")["per_env"] == {"code": 12}


def test_a_transfer_run_naming_an_inactive_environment_is_refused_by_key():
    from closedloop.config import Params

    with pytest.raises(ValueError, match=r"generate.envs: \['cobol'\] are not active environments"):
        Params.model_validate({"generate": {"envs": ["cobol"]}})
    with pytest.raises(ValueError, match=r"generate.envs: \['rules'\]"):
        Params.model_validate({"generate": {"envs": ["rules"]}, "envs": {"rules": {"share": 0}}})


def test_a_user_environment_has_no_heldout_slice_unless_its_section_sets_one():
    """Its generate may not know the slice (an older one tags whatever slice it is asked for), so the
    benchmark must not ask it for held-out tasks it cannot tell apart."""
    from closedloop.config import Params

    custom = {"entry": "my.envs:Echo", "benchmark": {"core": 3, "edge": 1, "failure_modes": 1}}
    params = Params.model_validate({"envs": {"custom": {"echo": custom}}})
    assert params.envs.section("echo").benchmark.heldout == 0
    custom["benchmark"]["heldout"] = 4
    assert Params.model_validate({"envs": {"custom": {"echo": custom}}}).envs.section("echo").benchmark.heldout == 4
