"""The data environment: generation, the split rule, and verdicts on real sandbox runs (pandas preloaded)."""

from __future__ import annotations

import collections

import pytest

from closedloop.config import DataEnvParams
from closedloop.envs import environment_class
from closedloop.envs.base import HELDOUT, SLICES, TRAINED_SLICES, Environment, in_benchmark
from closedloop.envs.data import STEPS, DataEnv, compare_tables, operation_key, unchanged_baseline, values_credit
from closedloop.envs.data_tasks import FAMILIES
from closedloop.sandbox import Job, Limits, SandboxPool
from closedloop.sandbox.pool import DEFAULT_PRELOAD

STOP_STRINGS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")
PARAMS = DataEnvParams()


@pytest.fixture(scope="module")
def env() -> DataEnv:
    return DataEnv(PARAMS)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, limits=Limits.of(PARAMS.sandbox), isolation="auto",
                     preload=DEFAULT_PRELOAD + DataEnv.sandbox_preload) as pool:
        # Say plainly when the jail cannot use pandas, rather than failing every verdict below. A pivot
        # imports modules pandas loads lazily, so the job's uid must be able to read site-packages too.
        program = ("def probe():\n    import pandas as pd\n    frame = pd.DataFrame({'a': [1, 1], 'b': [2, 3]})\n"
                   "    return int(frame.pivot_table(index='a', values='b', aggfunc='sum').iloc[0, 0])\n")
        probe = pool.run([Job(program, "probe", [[]])])[0]
        if not (probe.outputs and probe.outputs[0].ok and probe.outputs[0].value == 5):
            pytest.fail(f"the sandbox jail cannot import pandas ({probe.status}: "
                        f"{probe.outputs[0].error if probe.outputs else probe.error}); the data env needs "
                        "the interpreter's site-packages visible (and readable by the job uid) in the workers")
        yield pool


@pytest.fixture(scope="module")
def tasks(env):
    """120 training tasks and 30 of each benchmark slice."""
    train = env.generate(120, seed=0, split="train")
    bench = [task for slice in SLICES for task in env.generate(30, seed=0, split="benchmark", slice=slice)]
    return train + bench


def _one_per_kind(tasks, count=1):
    taken = collections.Counter()
    out = []
    for task in tasks:
        if taken[task.kind] < count:
            taken[task.kind] += 1
            out.append(task)
    return out


def _expr(task) -> str:
    return task.reference[len("    return "):-1]


def _signature(verdict):
    return (verdict.components, verdict.steps, verdict.passed, verdict.feedback, verdict.status, verdict.failed_step)


# -- the interface and generation ------------------------------------------------------------------


def test_interface(env):
    assert isinstance(env, Environment)
    assert environment_class("data") is DataEnv
    assert env.uses_sandbox and env.sandbox_preload == ("pandas",)
    assert set(env.default_weights) <= set(env.components) == set(env.component_sources())


def test_task_shape_and_sizes(tasks):
    assert len(tasks) >= 200
    for task in tasks:
        assert task.env == "data" and task.entry_point == "solve" and task.kind in {f.kind for f in FAMILIES}
        assert len(task.prompt) <= 500 and len(task.reference) <= 200, task.task_id
        assert task.reference.endswith("\n") and task.reference.startswith("    return ")
        assert not any(stop in task.reference for stop in STOP_STRINGS)
        assert task.prompt.endswith("):\n") and "data.csv" in task.checks["files"]
        assert task.checks["order"] in ("exact", "any")
        assert task == type(task).from_record(task.to_record())


def test_ids_unique_and_slices(env, tasks):
    assert len({t.task_id for t in tasks}) == len(tasks)
    train = [t for t in tasks if t.split == "train"]
    assert {t.slice for t in train} == set(TRAINED_SLICES)  # every family but the held-out ones, tagged by its slice
    for slice in SLICES:
        bench = [t for t in tasks if t.split == "benchmark" and t.slice == slice]
        assert len(bench) == 30 and {t.kind for t in bench} == {f.kind for f in FAMILIES if f.slice == slice}


def test_generate_is_deterministic(env):
    assert env.generate(25, seed=7, split="train") == env.generate(25, seed=7, split="train")
    edge = dict(seed=7, split="benchmark", slice="edge")
    assert env.generate(10, **edge) == env.generate(10, **edge)
    assert env.generate(25, seed=7, split="train") != env.generate(25, seed=8, split="train")


def test_splits_are_disjoint(env, tasks):
    keys = {t.split: set() for t in tasks}
    for task in tasks:
        key = operation_key(task.checks["spec"])
        # a held-out family is never trained on: its benchmark tasks come from its whole space
        assert task.slice == HELDOUT or in_benchmark(key) == (task.split == "benchmark")
        keys[task.split].add(key)
    more_train = {operation_key(t.checks["spec"]) for t in env.generate(300, seed=1, split="train")}
    assert not (keys["train"] | more_train) & keys["benchmark"]


def test_exhausted_space_and_bad_arguments(env):
    with pytest.raises(ValueError, match="distinct benchmark tasks"):
        env.generate(10_000, seed=0, split="benchmark", slice="failure_modes")
    with pytest.raises(ValueError, match="split"):
        env.generate(1, seed=0, split="test")
    with pytest.raises(ValueError, match="slice"):
        env.generate(1, seed=0, split="benchmark", slice="hard")


# -- comparing tables (pure) -----------------------------------------------------------------------

EXPECTED = {"columns": ["k", "x"], "dtypes": ["str", "float"], "rows": [["a", 1.5], ["b", None], ["c", 0.1 + 0.2]]}


def _got(rows, columns=("k", "x"), dtypes=("str", "float")):
    return {"columns": list(columns), "dtypes": list(dtypes), "rows": rows}


@pytest.mark.parametrize("got, order, schema_ok, fraction, passed", [
    (_got([["a", 1.5], ["b", None], ["c", 0.3]]), "exact", True, 1.0, True),  # float within tolerance
    (_got([["c", 0.3], ["a", 1.5], ["b", None]]), "any", True, 1.0, True),  # any order: rows matched after sorting
    (_got([["c", 0.3], ["a", 1.5], ["b", None]]), "exact", True, 4 / 6, False),  # exact order: a row out of place
    (_got([["a", 1.5], ["x", 2.0], ["b", None], ["c", 0.3]]), "exact", True, 6 / 8, False),  # an extra row costs itself
    (_got([["a", 1.5], ["b", 0.0], ["c", 0.3]]), "exact", True, 5 / 6, False),  # missing vs 0.0
    (_got([["a", 1.5], ["b", None]]), "exact", True, 4 / 6, False),  # a row missing
    (_got([["a", 1.5], ["b", None], ["c", 0.3], ["d", 1.0]]), "exact", True, 6 / 8, False),  # an extra row
    (_got([["a", 1.5], ["b", None], ["c", 0.3]], dtypes=("str", "int")), "exact", False, 1.0, False),  # dtype
    (_got([["a"], ["b"], ["c"]], columns=("k",), dtypes=("str",)), "exact", False, 3 / 6, False),  # column missing
    ("solve returned int, not a DataFrame", "exact", False, 0.0, False),
])
def test_compare_tables(got, order, schema_ok, fraction, passed):
    schema_error, values, values_error = compare_tables(EXPECTED, got, order, 1e-6)
    assert (not schema_error) == schema_ok
    assert values == pytest.approx(fraction)
    assert (not schema_error and not values_error) == passed


def test_compare_tables_names_the_difference():
    schema_error = compare_tables(EXPECTED, _got([], columns=("k", "y")), "exact", 1e-6)[0]
    assert schema_error == "columns ['k', 'y'] expected ['k', 'x']"
    error = compare_tables(EXPECTED, _got([["a", 1.5], ["b", None], ["c", 0.5]]), "exact", 1e-6)[2]
    assert error == "cell (2, 'x') is 0.5, expected 0.30000000000000004"
    empty = {"columns": ["k"], "dtypes": ["str"], "rows": []}
    assert compare_tables(empty, _got([], columns=("k",), dtypes=("str",)), "exact", 1e-6) == ("", 1.0, "")


# -- verdicts on real sandbox runs -----------------------------------------------------------------


def test_every_reference_passes(env, pool, tasks):
    verdicts = env.verify_batch(tasks, [t.reference for t in tasks], pool)
    failures = [(t.task_id, v.feedback) for t, v in zip(tasks, verdicts) if not v.passed]
    assert not failures, failures[:5]
    for verdict in verdicts:
        assert verdict.components == {name: 1.0 for name in env.components}
        assert list(verdict.steps) == list(STEPS) and verdict.failed_step is None and verdict.status == "passed"


def _perturbations(task):
    """(what, completion, the step that must fail) for every perturbation that applies to ``task``."""
    expr, spec, expected = _expr(task), task.checks["spec"], task.checks["expected"]
    rows = expected["rows"]
    out = [("drop a column", f"    return ({expr}).iloc[:, :-1]\n", "schema_matches"),
           ("not a table", "    return len(df)\n", "schema_matches"),
           ("a series", "    return df[df.columns[0]]\n", "schema_matches"),
           ("unknown column", '    return df["no_such_column"]\n', "runs")]
    if "other.csv" in task.checks["files"]:
        out.append(("ignored other.csv", "    return df\n", "schema_matches"))
    if rows:
        out.append(("drop the last row", f"    return ({expr}).iloc[:-1]\n", "values_match"))
    if any(kind != "str" for kind in expected["dtypes"]):
        out.append(("all as text", f"    return ({expr}).astype(str)\n", "schema_matches"))
    if task.checks["order"] == "exact" and rows != rows[::-1]:
        out.append(("reversed rows", f"    return ({expr}).iloc[::-1]\n", "values_match"))
    if spec["op"] == "filter" and spec["cmp"] in "><" and task.kind != "empty_filter":
        flipped = {">": "<", "<": ">"}[spec["cmp"]]
        out.append(("flipped comparison", task.reference.replace(f" {spec['cmp']} ", f" {flipped} "), "values_match"))
    if task.kind == "threshold":
        out.append((">= for >", task.reference.replace(f"{spec['cmp']} ", f"{spec['cmp'][0]} "), "values_match"))
    if "as_index=False" in expr:
        kept = task.reference.replace("as_index=False", "as_index=True")
        out.append(("kept the group index", kept, "schema_matches"))
    if task.kind == "descending":
        if spec["high"]:
            swapped = expr.replace(", ascending=False", "")
        else:
            swapped = expr.replace(").head(", ", ascending=False).head(")
        out.append(("ascending for descending", f"    return {swapped}\n", "values_match"))
    if spec["op"] == "divide":
        out.append(("integer division", task.reference.replace(" / ", " // "), "schema_matches"))
    return out


def test_perturbations_fail_at_the_right_step(env, pool, tasks):
    cases = [(task, what, completion, step) for task in _one_per_kind(tasks, 3)
             for what, completion, step in _perturbations(task)]
    verdicts = env.verify_batch([c[0] for c in cases], [c[2] for c in cases], pool)
    seen = set()
    for (task, what, completion, step), verdict in zip(cases, verdicts):
        where = f"{task.task_id} {what}: {verdict.feedback}"
        assert not verdict.passed and verdict.failed_step == step, where
        assert min(verdict.components.values()) < 1.0, where
        assert verdict.feedback.startswith({"runs": "step runs:", "schema_matches": "step schema:",
                                            "values_match": "step values:"}[step]), where
        seen.add(what)
        if what == "drop the last row" and task.checks["order"] == "exact":
            # Partial credit stays: the cells right, above what returning the input unchanged matches.
            rows = len(task.checks["expected"]["rows"])
            credit = values_credit((rows - 1) / rows, True, unchanged_baseline(task))
            assert verdict.components["values"] == pytest.approx(credit), where
        if step == "runs":  # it parsed (the step says so), but earned nothing of the task
            assert verdict.status == "runtime_error" and verdict.steps["parses"] and verdict.components["syntax"] == 0.0
    assert {"flipped comparison", ">= for >", "kept the group index", "ascending for descending",
            "integer division", "reversed rows", "ignored other.csv"} <= seen


def test_feedback_names_schema_and_cells(env, pool, tasks):
    task = next(t for t in tasks if t.kind == "keep_key" and "agg(" in t.reference)
    verdict = env.verify(task, task.reference.replace("as_index=False", "as_index=True"), pool)
    name = task.checks["spec"]["name"]
    assert verdict.feedback == f"step schema: columns ['{name}'] expected ['{task.checks['spec']['by']}', '{name}']"
    verdict = env.verify(task, "    return 7\n", pool)
    assert verdict.feedback == "step schema: solve returned int, not a DataFrame"


@pytest.mark.parametrize("completion", [
    "",  # nothing at all
    "garbage !!! not python ???",
    "    return df[df[",  # truncated mid-expression
    "\x00\x00",
    "    return df.sort_values(\"",  # an unterminated string
])
def test_malformed_output_gets_zero(env, pool, tasks, completion):
    for task in _one_per_kind(tasks)[:4]:
        verdict = env.verify(task, completion, pool)
        assert verdict.components == {name: 0.0 for name in env.components}
        assert verdict.failed_step == "parses" and verdict.status == "syntax_error" and not verdict.passed


def test_truncated_references_never_pass(env, pool, tasks):
    chosen = _one_per_kind(tasks)
    cut = [t.reference[:t.reference.index("(") + 1] if "(" in t.reference else t.reference[:t.reference.index("[") + 1]
           for t in chosen]
    for verdict in env.verify_batch(chosen, cut, pool):
        assert verdict.components == {name: 0.0 for name in env.components} and verdict.failed_step == "parses"


def test_the_model_cannot_replace_the_driver(env, pool, tasks):
    task = next(t for t in tasks if t.checks["expected"]["rows"])
    forged = repr(task.checks["expected"])
    completion = f"    return df.iloc[:0]\n_closedloop_main = lambda *names: {forged}\n"
    verdict = env.verify(task, completion, pool)
    assert not verdict.passed and verdict.components["values"] < 1.0


def test_timeout_is_a_run_failure(env, pool, tasks):
    verdict = env.verify(tasks[0], "    while True:\n        pass\n", pool)
    assert verdict.status == "timeout" and verdict.failed_step == "runs"
    assert verdict.components == {"syntax": 0.0, "runs": 0.0, "schema": 0.0, "values": 0.0}  # nothing earned


def test_verdicts_are_deterministic(env, pool, tasks):
    chosen = _one_per_kind(tasks)
    completions = [t.reference if i % 2 else f"    return ({_expr(t)}).iloc[:-1]\n" for i, t in enumerate(chosen)]
    first = env.verify_batch(chosen, completions, pool)
    second = env.verify_batch(chosen, completions, pool)
    assert [_signature(v) for v in first] == [_signature(v) for v in second]
    assert _signature(env.verify(chosen[1], completions[1], pool)) == _signature(first[1])


def test_infra_error_is_not_judged(env, tasks):
    from closedloop.envs.data import judge
    from closedloop.sandbox.records import infra_error

    verdict = judge(tasks[0], infra_error("worker died", "fork"), Limits.of(PARAMS.sandbox))
    assert verdict.status == "infra_error" and verdict.components == {name: None for name in env.components}
    assert verdict.failed_step is None and not verdict.passed


def test_model_code_runs_only_in_the_sandbox(env, pool, tasks, tmp_path):
    """A completion's side effects never reach this process or the host: it ran in the jail."""
    marker = tmp_path / "escaped.txt"
    completion = (f"    open({str(marker)!r}, 'w').write('ran here')\n"
                  "    import os\n    os.environ['CLOSEDLOOP_ESCAPED'] = '1'\n    return df\n")
    verdict = env.verify(tasks[0], completion, pool)
    assert not marker.exists() and "CLOSEDLOOP_ESCAPED" not in __import__("os").environ
    assert verdict.steps["parses"] is True and not verdict.passed  # it ran, somewhere else


# -- chat replies: the program is read out of them first (envs/extraction.py) ------------------------


def _def_line(task) -> str:
    return task.prompt.splitlines()[-1]  # "def solve(df):"


@pytest.mark.parametrize("wrap, how", [
    (lambda t: f"Here's the code:\n```python\nimport pandas as pd\n\n{_def_line(t)}\n{t.reference}```\nIt filters...", "fenced"),
    (lambda t: f"```py\n{t.reference}```", "fenced"),  # the body only
    (lambda t: f"import pandas as pd\n{_def_line(t)}\n{t.reference}\nThat is all.", "signature"),  # unfenced
])
def test_a_wrapped_reference_passes_like_the_raw_one(env, pool, tasks, wrap, how):
    chosen = _one_per_kind(tasks)
    for task, verdict in zip(chosen, env.verify_batch(chosen, [wrap(t) for t in chosen], pool)):
        assert verdict.passed and verdict.components == {name: 1.0 for name in env.components}, (task.task_id, verdict)
        assert list(verdict.steps) == ["extract", *STEPS] and verdict.steps["extract"] == how


def test_a_broken_fence_fails_at_the_extract_step(env, pool, tasks):
    for completion, error in ((f"```python\n{_def_line(tasks[0])}\n{tasks[0].reference}", "is never closed"),
                              ("```sql\nSELECT * FROM df\n```", "expected a ```python block")):
        verdict = env.verify(tasks[0], completion, pool)
        assert verdict.failed_step == "extract" and verdict.status == "format_error" and not verdict.passed
        assert verdict.feedback.startswith("extract: ") and error in verdict.feedback
        assert verdict.components == {name: 0.0 for name in env.components}
        assert list(verdict.steps) == ["extract", *STEPS] and not any(verdict.steps.values())
