"""What every verifiable environment exchanges with the rest of the loop: tasks and verdicts.

Both are plain, JSON-serialisable records so they can be written to batch files, cross process
boundaries, and be hashed by DVC without surprises.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One instance an environment generated.

    ``prompt`` is all the policy sees; ``checks`` are hidden from it and only the verifier reads them.
    ``reference`` is a known-good completion (the warm start learns from it; tests check the verifier
    gives it full reward).
    """

    task_id: str
    env: str
    split: str  # "train" or "benchmark"
    slice: str  # benchmark slice ("core", ...); "train" tasks use "core"
    kind: str  # the generator family, for per-kind reporting
    prompt: str
    entry_point: str
    checks: dict[str, Any]
    reference: str

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Task":
        return cls(**record)


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one completion.

    ``components`` are the separate reward signals in [0, 1] (``None`` = not applicable), combined by
    weights from params.yaml elsewhere. ``steps`` are the step signals in order (parses → runs →
    tests). ``feedback`` is a short message usable as the prompt of a failure→fix pair.
    ``timing`` holds wall-clock figures, kept apart so batch files stay deterministic.
    """

    components: dict[str, float | None]
    steps: dict[str, Any]
    passed: bool
    feedback: str
    status: str
    timing: dict[str, float] = field(default_factory=dict)
