"""The data environment: a generated CSV and a request; the model writes pandas code returning a table.

The prompt names the columns of data.csv (and other.csv for joins), shows two rows and the request,
and opens ``def solve(df):``. The sandboxed program is prompt + completion (for a chat reply, what
envs/extraction.py reads from it; the steps then start with ``extract``) + a driver appended here
(after the completion, so the model cannot define it first): it reads the CSV files, calls
``solve`` and returns the table as plain data (columns, a dtype kind per column, rows with NaN as
None). The expected table is the generator's own reference run in this process on the same CSV,
read back through the same conversion. The verifier compares schema (column names and order, dtype
kinds), then cells (row-aligned by the task's order rule, floats within a tolerance); partial credit
is the fraction of expected cells matched, with extra and missing rows counted against it.

In an episode (envs/episodes.py) a task's one input cannot be partitioned: its checks are verified
whole, and the model reads the error's last line, what its table has and where it is wrong (the
position and value got of the first differing cell), never an expected cell, dtype or row count
(tables.py); the expected columns only when the prompt names them all.

Splits are disjoint by operation: a task's key is the hash of its schema and reference code (not of
its data or wording), so the benchmark holds operations that training never shows.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Literal, TypedDict, Union

from closedloop.envs import extraction
from closedloop.envs.base import (
    HELDOUT,
    BaseEnvironment,
    Task,
    Verdict,
    check_split,
    in_benchmark,
    not_judged,
    source_of,
    stable_hash,
)
from closedloop.envs.data_tasks import FAMILIES, SCHEMAS, Family, Tables, make_tables, render, to_csv
from closedloop.envs.episodes import error_line, status_only
from closedloop.envs.extraction import Extraction, extract_program
from closedloop.envs.tables import compare_tables, shown_difference
from closedloop.envs.taskfile import file_tree_problems
from closedloop.sandbox.records import ExecResult, Job

if TYPE_CHECKING:
    from closedloop.config import DataEnvParams
    from closedloop.sandbox.pool import SandboxPool

ENTRY_POINT = "solve"
FLOAT_TOL = 1e-6  # relative and absolute: pandas may sum in another order than the model's code
_DRAWS_PER_TASK = 30  # tables drawn for one spec before the spec is skipped (a family's accept rejects them)
STEPS = ("parses", "runs", "schema_matches", "values_match")

# Appended after the completion. Names start with _closedloop_ so a model's code will not collide with
# them, and come last so the model cannot redefine them. _closedloop_table also runs in this process
# (on the trusted reference's output), so both sides read tables the same way.
DRIVER = '''

def _closedloop_cell(value):
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        return None if value != value else value
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        value = item()
        kind = type(value)
        if value is None or kind is bool or kind is int or kind is str:
            return value
        if kind is float:
            return None if value != value else value
    return "<" + type(value).__name__ + ">"


def _closedloop_kind(column, pd):
    dtype = column.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    if isinstance(dtype, pd.StringDtype):
        return "str"
    # An object column of strings (pandas 2's default); one with no values at all counts as str too, as
    # pandas 2 leaves an emptied text column (pandas 3 keeps its str dtype).
    if dtype == object and all(type(v) is str for v in column.dropna().tolist()):
        return "str"
    return "other"


def _closedloop_table(out):
    import pandas as pd
    if isinstance(out, pd.Series):
        out = out.to_frame()
    if not isinstance(out, pd.DataFrame):
        return {"error": "solve returned " + type(out).__name__ + ", not a DataFrame"}
    kinds = [_closedloop_kind(out.iloc[:, i], pd) for i in range(out.shape[1])]
    cells = out.astype(object).where(pd.notna(out), None).values.tolist()
    rows = [[_closedloop_cell(v) for v in row] for row in cells]
    return {"columns": [str(c) for c in out.columns], "dtypes": kinds, "rows": rows}


def _closedloop_main(*names):
    import pandas as pd
    return _closedloop_table(solve(*[pd.read_csv(name) for name in names]))
'''
DRIVER_ENTRY = "_closedloop_main"

Cell = Union[bool, int, float, str, None]  # None: a missing value (NaN)


class Table(TypedDict):
    """A table as the driver returns it and a task's expected one is stored."""

    columns: list[str]  # column names, in order
    dtypes: list[Literal["bool", "int", "float", "str", "other"]]  # _closedloop_kind's, one per column
    rows: list[list[Cell]]  # one list of cells per row, in the columns' order


class DataChecks(TypedDict):
    """What the verifier reads of a task's checks (the generator's spec rides along, unread)."""

    files: dict[str, str]  # CSV text by file name, placed in the job directory
    args: list[str]  # the files solve() is called with, in order
    expected: Table
    order: Literal["exact", "any"]  # whether row order counts
    float_tol: float  # relative and absolute tolerance of float cells


class DataEnv(BaseEnvironment):
    name = "data"
    uses_sandbox = True
    sandbox_preload: tuple[str, ...] = ("pandas",)
    components = ("syntax", "runs", "schema", "values")
    default_weights = {"syntax": 0.1, "runs": 0.1, "schema": 0.2, "values": 0.6}

    task_checks = DataChecks

    def __init__(self, params: DataEnvParams) -> None:
        self.params = params

    @staticmethod
    def check_task(task: Task) -> list[str]:
        """What the declared shapes cannot say: the driver's entry point, and a table that holds together."""
        checks, table = task.checks, task.checks["expected"]
        problems = file_tree_problems(checks["files"], "checks.files")
        if task.entry_point != ENTRY_POINT:
            problems.append(f"field 'entry_point' must be {ENTRY_POINT!r} (the driver calls it), got {task.entry_point!r}")
        problems += [f"checks.args[{i}] {name!r} is not one of checks.files" for i, name in enumerate(checks["args"])
                     if name not in checks["files"]]
        if not checks["float_tol"] >= 0:  # math.isclose refuses a negative tolerance
            problems.append(f"checks.float_tol must be >= 0, got {checks['float_tol']}")
        width = len(table["columns"])
        if len(table["dtypes"]) != width:
            problems.append(f"checks.expected.dtypes must hold one dtype per column ({width}), got {len(table['dtypes'])}")
        problems += [f"checks.expected.rows[{i}] must hold one cell per column ({width}), got {len(row)}"
                     for i, row in enumerate(table["rows"]) if len(row) != width]
        return problems

    # -- episodes (envs/episodes.py) -------------------------------------------------------------

    def split_checks(self, task: Task) -> tuple[dict[str, Any], dict[str, Any]]:
        """One input, so no partition: the same checks both ways, whose expected table no feedback shows."""
        return task.checks, task.checks

    def shown_feedback(self, task: Task, verdict: Verdict) -> str:
        """The error's last line for a program that did not parse or run; for a wrong table, what it
        has and where it is wrong (tables.shown_difference), never an expected cell, dtype or row count."""
        if verdict.passed:
            return f"passed the visible checks: all {len(task.checks['expected']['rows'])} rows match"
        step, _, detail = verdict.feedback.partition(": ")
        if step == "extract":
            return verdict.feedback  # says how the reply was read: nothing of the checks
        if step in ("step parses", "step runs"):
            return f"{step}: {error_line(detail)}"
        shown = shown_difference(detail, task.checks, task.prompt) if step in ("step schema", "step values") else None
        return f"{step}: {shown}" if shown is not None else status_only(verdict)

    # -- generation ------------------------------------------------------------------------------

    def generate(self, n: int, seed: int, split: str, slice: str = "core") -> list[Task]:
        """``n`` distinct tasks of ``split``: families in round robin, each family's operations in a
        seeded order; a family whose operations run out drops out of the rotation."""
        check_split(self.name, split, slice, n)
        families = [f for f in FAMILIES if (f.slice != HELDOUT if split == "train" else f.slice == slice)]
        rng = random.Random(f"data/{split}/{'' if split == 'train' else slice}/{seed}")
        queues = {f.kind: _operations(f, split, rng) for f in families}
        seen: set[str] = set()
        tasks: list[Task] = []
        while len(tasks) < n:
            active = [f for f in families if queues[f.kind]]
            if not active:
                raise ValueError(f"data env: only {len(tasks)} distinct {split} tasks of "
                                 f"{[f.kind for f in families]} exist; ask for fewer than {n}")
            for family in active:
                if len(tasks) == n:
                    break
                while queues[family.kind]:
                    key, spec = queues[family.kind].pop()
                    task = None if key in seen else _build(family, spec, key, split)
                    if task is not None:
                        seen.add(key)
                        tasks.append(task)
                        break
        return tasks

    # -- verification ----------------------------------------------------------------------------

    def verify_batch(self, tasks: list[Task], completions: list[str], pool: SandboxPool) -> list[Verdict]:
        """One sandbox job per completion whose program could be read (extraction.extract_program: a raw
        continuation's is prompt + completion); never raises on bad code."""
        self.check_batch(tasks, completions)
        read = [extract_program(c, t.prompt, t.entry_point) for t, c in zip(tasks, completions)]
        todo = [i for i, extraction in enumerate(read) if not extraction.failed]
        results = pool.run([program_job(tasks[i], read[i].text) for i in todo]) if todo else []
        verdicts = [_not_extracted(extraction) for extraction in read]
        baselines: dict[str, float] = {}  # per task: one baseline however many samples it has
        for i, result in zip(todo, results):
            task = tasks[i]
            if task.task_id not in baselines:
                baselines[task.task_id] = unchanged_baseline(task)
            verdicts[i] = _with_extraction(judge(task, result, pool.limits, baselines[task.task_id]), read[i])
        return verdicts

    def component_sources(self) -> dict[str, tuple[Callable | type, Any]]:
        config = {"driver": DRIVER, "float_tol": FLOAT_TOL, "extraction": extraction.version(),
                  "credit": [source_of(values_credit), source_of(unchanged_baseline)]}
        return {"syntax": (judge, config), "runs": (judge, config),
                "schema": (compare_tables, config), "values": (compare_tables, config)}


# -- building a task -----------------------------------------------------------------------------


def _operations(family: Family, split: str, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """(key, spec) of the family's operations in ``split``, in a seeded order (popped from the end). A
    held-out family is never trained on: the benchmark draws from all of its operations."""
    pairs = [(operation_key(spec), spec) for spec in family.specs()]
    pairs = [(key, spec) for key, spec in pairs if family.slice == HELDOUT or in_benchmark(key) == (split == "benchmark")]
    rng.shuffle(pairs)
    return pairs[::-1]


def operation_key(spec: dict[str, Any]) -> str:
    """What a task asks, as a hash: its schema and reference code (the same whatever family drew it)."""
    return stable_hash({"schema": spec["schema"], "code": render(spec)[1]})


def _prompt(tables: Tables, request: str) -> str:
    lines = ["import pandas as pd"]
    for file, variable in (("data.csv", "df"), ("other.csv", "other")):
        if file in tables:
            columns, rows = tables[file]
            lines.append(f'# {variable} = pd.read_csv("{file}"), e.g.')
            lines += ["# " + line for line in to_csv(columns, rows[:2 if file == "data.csv" else 1]).splitlines()]
    lines.append(f"# Task: {request}")
    lines.append(f"def {ENTRY_POINT}({', '.join(['df', 'other'][:len(tables)])}):")
    return "\n".join(lines) + "\n"


def _build(family: Family, spec: dict[str, Any], key: str, split: str) -> Task | None:
    """The task of one operation, its tables drawn from an rng seeded by its key (None: no table fits)."""
    schema = SCHEMAS[spec["schema"]]
    request, expression, order = render(spec)
    reference = f"    return {expression}\n"
    rng = random.Random(key)
    for _ in range(_DRAWS_PER_TASK):
        tables = make_tables(family.kind, spec, schema, rng)
        files = {file: to_csv(*table) for file, table in tables.items()}
        prompt = _prompt(tables, request)
        expected = _run_trusted(prompt + reference, files)
        if family.accept(spec, expected["rows"], len(tables["data.csv"][1])):
            break
    else:
        return None
    return Task(
        task_id=f"data/{split}/{family.slice}/{key[:12]}",
        env="data",
        split=split,
        slice=family.slice,
        kind=family.kind,
        prompt=prompt,
        entry_point=ENTRY_POINT,
        checks={"files": files, "args": sorted(files), "expected": expected, "order": order, "float_tol": FLOAT_TOL,
                "spec": spec},
        reference=reference,
    )


def _run_trusted(program: str, files: dict[str, str]) -> dict[str, Any]:
    # Only ever called on the generator's own references, never on model output.
    import pandas as pd

    namespace: dict[str, Any] = {"__name__": "closedloop_reference"}
    exec(compile(program + DRIVER, "<reference>", "exec"), namespace)  # noqa: S102 - trusted generator output
    frames = [pd.read_csv(io.StringIO(files[name])) for name in sorted(files)]
    table = namespace["_closedloop_table"](namespace[ENTRY_POINT](*frames))
    return json.loads(json.dumps(table, allow_nan=False))  # plain JSON, as stored


# -- verification --------------------------------------------------------------------------------


def job_for(task: Task, completion: str) -> Job:
    """The sandbox job of a raw continuation."""
    return program_job(task, task.prompt + completion)


def program_job(task: Task, program: str) -> Job:
    # The program may end mid-line; the newline keeps the driver's first def at column 0.
    return Job(program + "\n" + DRIVER, DRIVER_ENTRY, calls=[list(task.checks["args"])], files=dict(task.checks["files"]))


def _not_extracted(extraction: Extraction) -> Verdict:
    """The verdict of a reply no program could be read from: nothing ran."""
    verdict = _verdict("format_error", extraction.feedback, "extract")
    return replace(verdict, steps={**extraction.steps, **verdict.steps})


def _with_extraction(verdict: Verdict, extraction: Extraction) -> Verdict:
    """``verdict`` with the extraction step first (nothing added for a raw continuation)."""
    return replace(verdict, steps={**extraction.steps, **verdict.steps}) if extraction.steps else verdict


def _verdict(status: str, feedback: str, failed: str | None, parses: bool = False, runs: bool = False,
             schema: bool = False, values: float = 0.0, timing: dict[str, float] | None = None,
             earned: bool = True) -> Verdict:
    """``earned`` False: the steps held, but the task earned nothing, so no component does either."""
    gate = 1.0 if earned else 0.0
    return Verdict(
        components={"syntax": gate * parses, "runs": gate * runs, "schema": gate * schema, "values": values},
        steps={"parses": parses, "runs": runs, "schema_matches": schema, "values_match": values},
        passed=failed is None, feedback=feedback, status=status, timing=timing or {}, failed_step=failed,
    )


def unchanged_baseline(task: Task) -> float:
    """The fraction of expected cells that returning an input table unchanged already matches
    (the best over the tables solve() is given): what doing nothing would earn.

    Read here from the task's CSV files with the driver's own conversion; the prompt is not run (a
    task from a file is data, not trusted code).
    """
    import pandas as pd

    namespace: dict[str, Any] = {"__name__": "closedloop_driver"}
    exec(compile(DRIVER, "<driver>", "exec"), namespace)  # noqa: S102 - our own driver, no task text
    checks = task.checks
    best = 0.0
    for name in checks["args"]:
        table = json.loads(json.dumps(namespace["_closedloop_table"](pd.read_csv(io.StringIO(checks["files"][name]))),
                                      allow_nan=False))
        best = max(best, compare_tables(checks["expected"], table, checks["order"], checks["float_tol"])[1])
    return best


def values_credit(values: float, schema_ok: bool, baseline: float) -> float:
    """Credit only for the cells the task asked to change: the values fraction above what returning
    the input unchanged scores (``baseline``), rescaled so a right table still earns 1.

    When the input's cells already are the answer (a task that selects or reorders columns), only
    the schema says whether the task was done: then the values count only with the right schema.
    """
    if baseline >= 1.0:
        return values if schema_ok else 0.0
    return max(0.0, (values - baseline) / (1.0 - baseline))


def judge(task: Task, result: ExecResult, limits: Any, baseline: float | None = None) -> Verdict:
    """The verdict on one sandbox result: parses -> runs -> schema_matches -> values_match.

    ``values_match`` and the values component are :func:`values_credit` (``baseline`` is
    :func:`unchanged_baseline`, computed when not given); syntax, runs and schema earn only when it
    is above 0, so returning the input unchanged, or any table no closer to the answer, earns 0.
    """
    timing = {"wall_s": result.wall_s}
    if result.status == "infra_error":
        return not_judged(DataEnv.components, STEPS, result.error)
    parses = bool(result.steps.get("parses"))
    if result.status == "error" and not parses:
        return _verdict("syntax_error", f"step parses: {result.error}", "parses", timing=timing)
    if result.status != "completed" or not result.outputs or not result.outputs[0].ok:
        status, what = _failure(result, limits)
        return _verdict(status, f"step runs: {what}", "runs", parses=True, timing=timing, earned=False)
    checks = task.checks
    got = _as_table(result.outputs[0].value)
    schema_error, values, values_error = compare_tables(checks["expected"], got, checks["order"], checks["float_tol"])
    if not schema_error and not values_error and values == 1.0:
        rows = len(checks["expected"]["rows"])
        return _verdict("passed", f"passed: all {rows} rows match", None, True, True, True, 1.0, timing)
    credit = values_credit(values, not schema_error, unchanged_baseline(task) if baseline is None else baseline)
    earned = credit > 0.0  # False: the table is no closer to the answer than the input was
    if schema_error:
        return _verdict("failed", f"step schema: {schema_error}", "schema_matches", True, True, False, credit, timing,
                        earned)
    feedback = f"step values: {values_error or 'some cells differ'}"
    return _verdict("failed", feedback, "values_match", True, True, True, credit, timing, earned)
    rows = len(checks["expected"]["rows"])
    return _verdict("passed", f"passed: all {rows} rows match", None, True, True, True, 1.0, timing)


def _failure(result: ExecResult, limits: Any) -> tuple[str, str]:
    """(verdict status, what went wrong) for a program that did not return a table."""
    if result.status == "timeout":
        return "timeout", f"timed out after {limits.timeout_s}s"
    if result.status == "memory":
        return "memory", f"exceeded the memory limit ({limits.memory_mb} MB)"
    if result.status == "output_limit":
        return "output_limit", f"printed or returned more than {limits.max_output_bytes} bytes ({result.error})"
    if result.status == "process_limit":
        return "process_limit", result.error
    if result.status == "completed" and result.outputs:
        return "runtime_error", f"solve raised {result.outputs[0].error}"
    return "runtime_error", result.error or f"the program ended early ({result.status})"


_CELL_TYPES = (type(None), bool, int, float, str)


def _as_table(value: Any) -> dict[str, Any] | str:
    """The driver's table, checked cell by cell (the model's code could have patched pandas), or an error."""
    if type(value) is dict and set(value) == {"error"} and type(value["error"]) is str:
        return value["error"]
    if type(value) is not dict or set(value) != {"columns", "dtypes", "rows"}:
        return "solve's result could not be read as a table"
    columns, dtypes, rows = value["columns"], value["dtypes"], value["rows"]
    if type(columns) is not list or type(dtypes) is not list or type(rows) is not list or len(dtypes) != len(columns):
        return "solve's result could not be read as a table"
    well_formed = all(type(c) is str for c in columns + dtypes) and all(
        type(r) is list and len(r) == len(columns) and all(type(v) in _CELL_TYPES for v in r) for r in rows)
    return value if well_formed else "solve's result could not be read as a table"
