"""Isolated execution of untrusted, model-written code behind one narrow interface.

    with SandboxPool(workers=2, limits=Limits(timeout_s=2.0)) as pool:
        results = pool.run([Job(program, "f", calls=[[1, 2], [3, 4]], expected=[3, 7])])

Every job runs in its own forked, confined process inside a jailed worker (see pool.py, jail.py,
isolation.py); the trusted grading happens on this side of the boundary (grader.py).
"""

from closedloop.sandbox.child import decode, encode, to_plain
from closedloop.sandbox.pool import SandboxPool, SandboxUnavailable
from closedloop.sandbox.records import ISOLATION_MODES, STATUSES, CallOutcome, ExecResult, Job, Limits

__all__ = ["ISOLATION_MODES", "STATUSES", "CallOutcome", "ExecResult", "Job", "Limits", "SandboxPool",
           "SandboxUnavailable", "decode", "encode", "to_plain"]
