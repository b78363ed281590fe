"""Isolated execution of untrusted, model-written code behind one narrow interface.

    with SandboxPool(workers=2, limits=Limits(timeout_s=2.0)) as pool:
        results = pool.run([Job(program, "f", [[1, 2], [3, 4]])])

Every job runs in its own forked process under rlimits (isolation "fork+rlimits"); a hardened
sandbox (namespaces, seccomp) will extend the same interface.
"""

from closedloop.sandbox.pool import SandboxPool
from closedloop.sandbox.child import to_plain
from closedloop.sandbox.records import ISOLATION, STATUSES, CallOutcome, ExecResult, Job, Limits

__all__ = ["ISOLATION", "STATUSES", "CallOutcome", "ExecResult", "Job", "Limits", "SandboxPool", "to_plain"]
