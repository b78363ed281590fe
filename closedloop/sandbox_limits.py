"""The sandbox's limits, declared once: each limit's type, default, lowest allowed value and meaning.

Plain data, read by both sides: ``Limits`` (closedloop/sandbox/records.py) checks every job's limits
against it, and each environment's ``sandbox`` section of params.yaml (closedloop/config/envs.py) is
built from it, so params.yaml accepts exactly what the sandbox runs with.

It sits beside the sandbox package rather than in it: importing any module of closedloop/sandbox/ runs
the package's ``__init__``, which imports the pool, and config is code of every stage, so every stage
would list the sandbox as a DVC code dependency (and rerun on an edit to it without running any code).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LimitSpec:
    """One limit of a sandboxed job."""

    name: str
    type: type  # int, float or bool
    default: int | float | bool
    description: str  # what it limits, as params.yaml's comments and the configuration reference say
    minimum: int | float | None = None  # the lowest value allowed; None: any value of the type
    exclusive: bool = False  # the minimum itself is refused: the value must be > minimum, not >=
    why: str = ""  # said when a value below the minimum is refused

    def expected(self) -> str:
        """What a valid value is, e.g. '>= 32'; '' when any value of the type is."""
        if self.minimum is None:
            return ""
        return f"{'>' if self.exclusive else '>='} {self.minimum}"

    def allows(self, value: int | float | bool) -> bool:
        if self.minimum is None:
            return True
        return value > self.minimum if self.exclusive else value >= self.minimum


LIMITS: dict[str, LimitSpec] = {spec.name: spec for spec in (
    LimitSpec("timeout_s", float, 2.0, "Wall-clock limit per sandboxed job.",
              minimum=0, exclusive=True),
    LimitSpec("memory_mb", int, 512, "Address-space limit per sandboxed job.",
              minimum=32, why="the interpreter alone needs ~20 MB"),
    LimitSpec("max_output_bytes", int, 65536, "Cap on stdout, stderr, each file and returned values.",
              minimum=1024),
    LimitSpec("disk_mb", int, 16, "Size of each worker's private tmpfs holding the job directories.",
              minimum=1),
    LimitSpec("processes", int, 16, "Processes and threads a job may have (RLIMIT_NPROC).", minimum=1),
    LimitSpec("open_files", int, 64, "Open files per job (RLIMIT_NOFILE).", minimum=8),
    LimitSpec("allow_exec", bool, False,
              "Whether jobs may run programs (execve); script environments need it."),
)}
