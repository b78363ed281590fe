"""Named points where a test can kill the run, to prove the loop resumes from anywhere.

``CLOSEDLOOP_FAULT=<point>`` makes the process send SIGKILL to its whole process group when it
reaches ``<point>``: no ``finally``, no atexit, no Prefect hook runs, exactly as when a machine
loses power or the OOM killer strikes. Unset (always, outside the tests), a point costs one dict
look-up. The points:

- ``stage:<name>``: a stage's outputs are written but not yet recorded in dvc.lock;
- ``train:checkpoint``: the train stage saved its first checkpoint, mid-training;
- ``train:round``: grpo's on-policy rounds: a round finished and its policy is saved, the next not begun;
- ``sample:round``: episodes (``sample.rounds``): a round sampled and verified, the next not begun;
- ``version:exp-save``: while ``dvc exp save`` runs (``CLOSEDLOOP_FAULT_DELAY_S`` after it started);
- ``version:mlflow-log``: the iteration's MLflow run is open and half logged;
- ``version:register``: the candidate is registered, no alias moved yet.
- ``shard:<Worker>:<index>``: a Ray worker finished shard ``<index>`` and dies before returning it
  (:func:`kill_worker_once`: that process alone, once per ``CLOSEDLOOP_FAULT_MARKER`` file, after
  ``CLOSEDLOOP_FAULT_SKIP`` earlier arrivals).
"""

from __future__ import annotations

import os
import signal

ENV = "CLOSEDLOOP_FAULT"


def armed(point: str) -> bool:
    return os.environ.get(ENV) == point


def fault_point(point: str) -> None:
    if armed(point):
        kill_now()


def kill_now() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def delay_s(default: float = 0.5) -> float:
    return float(os.environ.get(f"{ENV}_DELAY_S", default))


def kill_worker_once(point: str) -> None:
    """Kill only this process (a Ray worker, not its process group, which may hold the raylet), once:
    the first process to reach ``point`` leaves ``CLOSEDLOOP_FAULT_MARKER`` behind, so the retried
    shard runs through. The point ``shard:<Worker>:<index>`` fires after a shard's work, before its
    result is returned: the work is lost and must be done again."""
    if not armed(point):
        return
    marker = os.environ.get(f"{ENV}_MARKER")
    # CLOSEDLOOP_FAULT_SKIP=N: the first N arrivals pass (a later round's shard of the same index, as in an
    # episode's round 2); counted in files beside the marker, so across processes.
    for arrival in range(int(os.environ.get(f"{ENV}_SKIP", "0"))):
        try:
            os.close(os.open(f"{marker}.skip{arrival}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return
        except FileExistsError:
            continue
    if marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


def fault_env() -> dict[str, str]:
    """The fault variables set here, for workers started elsewhere (a Ray cluster); {} outside tests."""
    return {key: value for key, value in os.environ.items() if key.startswith(ENV)}
