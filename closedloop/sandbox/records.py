"""The plain records the sandbox exchanges with its callers: limits in, jobs in, results out.

Kept apart from the pool so that code which only reads results (grading, reports) imports nothing
that starts processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from closedloop.sandbox_limits import LIMITS

# Every status a job can end in:
#   passed / failed  the trusted grader judged the outputs (a job with expected values or a test)
#   completed        every call ran and nothing was there to judge it (a job with neither), or a
#                    script job (entry point "") ran to its end or to sys.exit(0)
#   error            the program did not load: a syntax error, an exception at load (for a script:
#                    an exception or a nonzero exit), no entry point
#   timeout, memory, output_limit, killed   the job process was stopped, or ended early; output_limit
#                    also when stdout or stderr reached the cap, whatever the program returned after
#   process_limit    a fork or thread start failed at Limits.processes (RLIMIT_NPROC), even if the
#                    program caught the error and returned
#   infra_error      the sandbox itself failed (twice): says nothing about the code, never counted
STATUSES = ("passed", "failed", "completed", "error", "timeout", "memory", "output_limit", "process_limit", "killed",
            "infra_error")
ISOLATION_MODES = ("auto", "bwrap", "fork")


@dataclass(frozen=True)
class Limits:
    """What one job may use; the defaults suit short functions. Each limit's default, lowest allowed
    value and meaning are declared once, in closedloop/sandbox_limits.py, which params.yaml's sandbox
    sections are built from too."""

    timeout_s: float = LIMITS["timeout_s"].default  # wall clock per job, from fork to exit
    memory_mb: int = LIMITS["memory_mb"].default  # address space (RLIMIT_AS) of the job's process
    max_output_bytes: int = LIMITS["max_output_bytes"].default  # cap on stdout, stderr, any file, returned JSON
    disk_mb: int = LIMITS["disk_mb"].default  # the worker's private tmpfs holding job directories (bubblewrap only)
    processes: int = LIMITS["processes"].default  # RLIMIT_NPROC: processes and threads of the job's uid
    open_files: int = LIMITS["open_files"].default  # RLIMIT_NOFILE
    allow_exec: bool = LIMITS["allow_exec"].default  # whether the job may execve (script environments run programs)

    def __post_init__(self) -> None:
        for spec in LIMITS.values():
            value = getattr(self, spec.name)
            if not spec.allows(value):
                why = f": {spec.why}" if spec.why else ""
                raise ValueError(f"Limits.{spec.name} ({value}) must be {spec.expected()}{why}")

    @classmethod
    def of(cls, settings: Any) -> "Limits":
        """The limits a params ``sandbox`` section (config.SandboxParams) sets; its ``isolation`` is the
        pool's, not a job's. Here, not in closedloop/config/: config is code of every stage, the sandbox is not."""
        return cls(**settings.model_dump(exclude={"isolation"}))

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Job:
    """One program to run, and how the trusted side judges it.

    ``calls`` are positional args per call (plain data). A job is judged by ``expected`` (one value
    per call, compared on the trusted side), by ``test`` (a trusted program defining
    ``check(candidate)``, run on the trusted side after ``prelude``, with ``candidate`` forwarding each
    call to the sandboxed process: HumanEval's format), or not at all (status "completed").
    ``files`` are placed in the job's directory before the program runs.

    An empty ``entry_point`` makes a script job: the program is the whole script, run once at load
    (as ``__main__``, in the job directory), with no calls; ``SystemExit`` with code 0 or None is a
    clean end. ``collect_files`` asks for the job directory's resulting tree in ``ExecResult.files``
    once the program (and every call) ran.
    """

    program: str
    entry_point: str
    calls: list[list] = field(default_factory=list)
    expected: list | None = None
    test: str | None = None
    prelude: str = ""
    files: dict[str, str] = field(default_factory=dict)
    limits: Limits | None = None  # None: the pool's
    collect_files: bool = False

    def __post_init__(self) -> None:
        if self.expected is not None and len(self.expected) != len(self.calls):
            raise ValueError(f"Job: {len(self.expected)} expected values for {len(self.calls)} calls")
        if self.test is not None and (self.calls or self.expected is not None):
            raise ValueError("Job: a test program makes its own calls; give test or calls, not both")
        if not self.entry_point and (self.calls or self.expected is not None or self.test is not None):
            raise ValueError("Job: a script job (entry_point '') makes no calls; give no calls, expected or test")
        if self.collect_files and self.test is not None:
            raise ValueError("Job: collect_files is for batch jobs; a test program's job cannot collect files")
        for path in self.files:
            parts = path.split("/")
            if path.startswith("/") or ".." in parts or not path or "" in parts:
                raise ValueError(f"Job.files: {path!r} must be a relative path inside the job directory")


@dataclass(frozen=True)
class CallOutcome:
    ok: bool  # the call returned (False: it raised)
    value: Any  # the returned value rebuilt from plain data when ok, else None
    error: str  # "TypeError: ..." when not ok, else ""
    passed: bool | None = None  # the grader's judgement of this call; None when nothing judged it


@dataclass(frozen=True)
class ExecResult:
    status: str  # one of STATUSES
    outputs: list[CallOutcome]  # one per call, in call order, for batch jobs that ran every call
    error: str  # what went wrong for the whole job (or the first failed test), "" when passed
    stdout: str  # both capped at Limits.max_output_bytes
    stderr: str
    exit_code: int | None  # the job process's exit code, -N when killed by signal N, None if never started
    wall_s: float
    cpu_s: float
    peak_memory_kb: int
    isolation: str  # the isolation level that ran it, e.g. "bwrap+uid+seccomp+rlimits"
    steps: dict[str, Any] = field(default_factory=dict)  # parses, loads, runs, tests_passed, tests_total
    # With Job.collect_files, once the program ran: {path relative to the job directory: text}, files
    # only, directories implied (see child.collect_files for the markers); None otherwise. It is the
    # program's own output: a forged tree is no worse than writing those files.
    files: dict[str, str] | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def infra_error(message: str, isolation: str) -> ExecResult:
    """A result for a job the sandbox itself failed to run: it says nothing about the code."""
    steps = {"parses": None, "loads": None, "runs": None, "tests_passed": None, "tests_total": None}
    return ExecResult("infra_error", [], message, "", "", None, 0.0, 0.0, 0, isolation, steps)
