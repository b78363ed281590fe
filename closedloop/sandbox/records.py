"""The plain records the sandbox exchanges with its callers: limits in, jobs in, results out.

Kept apart from the pool so that code which only reads results (grading, reports) imports nothing
that starts processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ISOLATION = "fork+rlimits"  # the level this sandbox provides; a hardened one will name its own

# Every status a job can end in. "ok" means the program loaded and every call ran to completion
# (a call may still have raised: see CallOutcome.ok); every other status is about the whole job.
STATUSES = ("ok", "syntax_error", "load_error", "timeout", "memory", "output_limit", "killed", "infra_error")


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 2.0  # wall clock per job, from fork to exit
    memory_mb: int = 512  # address space (RLIMIT_AS) of the job's process
    max_output_bytes: int = 65536  # cap on stdout, on stderr, on any file written, and on returned JSON

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"Limits.timeout_s ({self.timeout_s}) must be > 0")
        if self.memory_mb < 32:
            raise ValueError(f"Limits.memory_mb ({self.memory_mb}) must be >= 32: the interpreter alone needs ~20 MB")
        if self.max_output_bytes < 1024:
            raise ValueError(f"Limits.max_output_bytes ({self.max_output_bytes}) must be >= 1024")


@dataclass(frozen=True)
class Job:
    program: str
    entry_point: str
    calls: list[list]  # positional args per call, plain JSON data


@dataclass(frozen=True)
class CallOutcome:
    ok: bool
    value: Any  # canonical JSON data when ok (tuples arrive as lists), else None
    error: str  # "TypeError: ..." when not ok, else ""


@dataclass(frozen=True)
class ExecResult:
    status: str  # one of STATUSES
    outputs: list[CallOutcome]  # one per call when status == "ok", else empty (see pool docs for why)
    error: str  # what went wrong for the whole job, "" when ok
    stdout: str  # both capped at Limits.max_output_bytes
    stderr: str
    exit_code: int | None  # the job process's exit code, -N when killed by signal N, None if never started
    wall_s: float
    isolation: str  # the isolation level that ran it, e.g. "fork+rlimits"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def infra_error(message: str, isolation: str) -> ExecResult:
    """A result for a job the sandbox itself failed to run: it says nothing about the code."""
    return ExecResult("infra_error", [], message, "", "", None, 0.0, isolation)
