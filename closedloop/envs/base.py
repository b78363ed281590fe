"""What every verifiable environment exchanges with the rest of the loop, and the shape of an environment.

Tasks and verdicts are plain, JSON-serialisable records so they can be written to batch files, cross
process boundaries, and be hashed by DVC without surprises.

An environment is any class with the members of :class:`Environment`. The five built-in ones live
in this package (one module each); a user's is named in params.yaml (``envs.custom.<name>.entry``) as
``"module:Class"`` or as the name of a ``closedloop.environments`` entry point.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar, runtime_checkable

from closedloop.io import read_jsonl

SPLITS = ("train", "benchmark")
HELDOUT = "heldout"
# The slices training draws from (train tasks carry the slice of their family), and the benchmark's
# slices: those, plus tasks of families or combinations the train split never emits, so the benchmark
# measures transfer to work the policy was never trained on.
TRAINED_SLICES = ("core", "edge", "failure_modes")
SLICES = TRAINED_SLICES + (HELDOUT,)
BENCHMARK_PER_MILLE = 150  # share of every environment's task space reserved for the benchmark


@dataclass(frozen=True)
class Task:
    """One instance an environment generated.

    ``prompt`` is all the policy sees; ``checks`` are hidden from it and only the verifier reads them.
    ``reference`` is a known-good completion (the warm start learns from it; tests check the verifier
    gives it full reward).
    """

    task_id: str  # unique within a file or batch; sample and reward rows refer to it
    env: str  # the environment that generated it and whose verifier scores it
    split: str  # "train" or "benchmark"
    slice: str  # "core", "edge", "failure_modes" or (benchmark only) "heldout"
    kind: str  # the generator family, for per-kind reporting
    prompt: str
    entry_point: str  # what the completion must define or answer with (a function, a script, a JSON object)
    checks: dict[str, Any]
    reference: str

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Task":
        return cls(**record)


def load_tasks(path: Path) -> list[Task]:
    """The tasks of a tasks file the generate or benchmark stage wrote (one Task record per line)."""
    fields = list(Task.__dataclass_fields__)
    return [Task.from_record({k: r[k] for k in fields}) for r in read_jsonl(path, required=fields)]


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one completion.

    ``components`` are the separate reward signals in [0, 1] (``None`` = not applicable), combined by
    weights from params.yaml elsewhere. ``steps`` are the step signals in the order the verifier
    checks them (e.g. parses → runs → tests); ``failed_step`` names the first one that failed (None
    when the completion passed or was not judged). When a chat reply's answer had to be read out of
    it first (envs/extraction.py), ``steps`` start with ``extract``: how it was read (a string, which
    reward shaping and check counts skip), or False when nothing could be read (then ``failed_step``
    is ``"extract"``); a raw continuation's steps have no ``extract``. ``feedback`` is a short message usable as the
    prompt of a failure→fix pair. ``timing`` holds wall-clock figures, kept apart so batch files stay
    deterministic.
    """

    components: dict[str, float | None]
    steps: dict[str, Any]
    passed: bool
    feedback: str
    status: str
    timing: dict[str, float] = field(default_factory=dict)
    failed_step: str | None = None


@runtime_checkable
class Environment(Protocol):
    """The interface the loop uses. ``__init__`` takes the environment's section of params.yaml.

    Optional, for tasks read from a file (envs/taskfile.py checks them at load, so a bad one is
    refused by line and field, not met by the verifier): ``task_checks``, a TypedDict of the
    ``checks`` fields the verifier reads, and ``check_task(task) -> list[str]`` (a staticmethod) for
    what a type cannot say; it runs only on checks that have the declared shapes.
    """

    name: str
    uses_sandbox: bool  # True: verify_batch runs completions in the pool it is given; False: pool is None
    components: tuple[str, ...]  # reward component names its verdicts carry
    default_weights: dict[str, float]  # used when params.yaml gives none for this environment

    def generate(self, n: int, seed: int, split: str, slice: str = "core") -> list[Task]:
        """``n`` distinct tasks, the same for the same arguments. Train never emits a benchmark task, nor
        one of the families or combinations the ``heldout`` slice holds."""
        ...

    def reference(self, task: Task) -> str:
        """A completion that gets full reward (the warm start learns from it)."""
        ...

    def verify_batch(self, tasks: list[Task], completions: list[str], pool: Any) -> list[Verdict]:
        """One verdict per completion, in order; never raises on bad output."""
        ...

    def component_sources(self) -> dict[str, tuple[Callable | type, Any]]:
        """{component name: (the code that computes it, its config)}: hashed into its version."""
        ...


class BaseEnvironment:
    """What every environment does the same way; built-in environments inherit it, users' may."""

    name: str

    @staticmethod
    def reference(task: Task) -> str:
        return task.reference

    def verify(self, task: Task, completion: str, pool: Any = None) -> Verdict:
        return self.verify_batch([task], [completion], pool)[0]  # type: ignore[attr-defined]

    def check_batch(self, tasks: list[Task], completions: list[str]) -> None:
        if len(tasks) != len(completions):
            raise ValueError(f"{self.name} env: {len(tasks)} tasks but {len(completions)} completions")


def stable_hash(data: Any) -> str:
    """sha256 of canonical JSON: the same for the same data in every process and on every machine."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def source_of(function: Callable) -> str:
    """A short hash of a function's source: put in a reward component's config when the component's
    score also depends on a helper outside the function its version hashes (rewards.sources)."""
    import inspect

    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:12]


def in_benchmark(key: str) -> bool:
    """The split a task belongs to, from a hash of what it asks (not of its seed or wording):
    a fixed bucket of the hash space, so train can never emit a benchmark task."""
    return int(stable_hash(key)[:8], 16) % 1000 < BENCHMARK_PER_MILLE


def check_split(env: str, split: str, slice: str, n: int) -> None:
    if split not in SPLITS:
        raise ValueError(f"{env} env: split must be one of {SPLITS}, got {split!r}")
    if slice not in SLICES:
        raise ValueError(f"{env} env: slice must be one of {SLICES}, got {slice!r}")
    if n < 0:
        raise ValueError(f"{env} env: n ({n}) must be >= 0")


# Rejection-sampling budget per task: a family that draws this many specs without a new task of the
# split and slice asked for counts as used up.
MAX_DRAWS_PER_TASK = 400
Found = TypeVar("Found")
Kind = TypeVar("Kind")


def draw_until(attempt: Callable[[], Found | None]) -> Found | None:
    """The first result of ``attempt`` (one draw from a family's seeded stream: None when the spec is
    a duplicate, of the other split or slice, or unfit) within MAX_DRAWS_PER_TASK tries; None when
    every try came back empty."""
    for _ in range(MAX_DRAWS_PER_TASK):
        found = attempt()
        if found is not None:
            return found
    return None


def round_robin(env: str, kinds: Sequence[Kind], n: int, draw: Callable[[Kind], Task | None], *, split: str,
                slice: str) -> list[Task]:
    """``n`` tasks, one per turn from ``kinds`` in round robin, each from ``draw(kind)`` (None: the
    kind has no new task left). A used-up kind passes its turn on to the next for the rest of the call,
    so the tasks drawn before it ran out are the same as if it never had."""
    tasks: list[Task] = []
    exhausted: set[int] = set()  # positions in ``kinds``
    for index in range(n):
        for offset in range(len(kinds)):
            position = (index + offset) % len(kinds)
            task = None if position in exhausted else draw(kinds[position])
            if task is not None:
                tasks.append(task)
                break
            exhausted.add(position)
        else:
            raise ValueError(f"{env} env: no new {split}/{slice} task of any family after {index} tasks "
                             f"({MAX_DRAWS_PER_TASK} draws each); the space is nearly exhausted, ask for fewer than {n}")
    return tasks


def not_judged(components: tuple[str, ...], steps: tuple[str, ...], error: str) -> Verdict:
    """The verdict of a sandbox infrastructure failure: says nothing about the completion."""
    return Verdict(components={name: None for name in components}, steps={name: None for name in steps},
                   passed=False, feedback=f"not judged (sandbox infrastructure error, not the completion's fault): {error}",
                   status="infra_error")
