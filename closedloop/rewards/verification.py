"""Verification in shards: the sandbox part of reward scoring, behind the executor.

Reward scoring itself stays one core function (rewards/scoring.py ``score_batch``: tasks, samples,
sources, weights → rows). What is expensive in it is the verifiers' sandboxed runs, so those are cut
into shards of (environment, task records, completions) and run by :class:`VerifierWorker`, each with
its own sandbox pools: in the stage's process (``local``) or one set per Ray actor (``ray``), so
environments are verified side by side. :class:`ShardedVerifiers` then answers the scoring code's
``verify_batch`` calls from those verdicts. A verdict depends on its task and completion only, so the
rows are the same for any sharding and either backend.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from typing import Any, Iterable, Sequence

from closedloop.config import Params, parse_params
from closedloop.envs import get_env
from closedloop.envs.base import Task, Verdict
from closedloop.execution.base import split
from closedloop.execution.factory import shard_resources
from closedloop.rewards.pools import EnvPools

VERIFIER_WORKER = "closedloop.rewards.verification:VerifierWorker"


class VerifierWorker:
    """Its own EnvPools (``setup``: ``params`` as a dict, ``sandbox_workers``); verifies shards."""

    def __init__(self, setup: dict) -> None:
        self.pools = EnvPools(parse_params(setup["params"]), setup.get("sandbox_workers"))

    def run(self, shard: dict) -> dict[str, Any]:
        """``shard``: env, tasks (records), completions → their verdicts as dicts, and the seconds."""

        env = shard["env"]
        started = time.perf_counter()
        verdicts = self.pools.verify_batch(env, [Task.from_record(t) for t in shard["tasks"]], shard["completions"])
        return {"verdicts": [asdict(v) for v in verdicts], "seconds": time.perf_counter() - started,
                "isolation": self.pools.isolation().get(env)}

    def close(self) -> None:
        self.pools.close()


def _task_key(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


class ShardedVerifiers:
    """EnvPools' interface (``env``, ``verify_batch``, ``isolation``) over verdicts the executor's
    workers computed. :meth:`prefetch` verifies a whole stage's requests in one round of shards;
    ``verify_batch`` answers from them and verifies, in shards, only what was not prefetched."""

    def __init__(self, params: Params, executor: Any) -> None:
        self.params = params
        self.executor = executor
        self.shards = params.execution.shards
        self._envs: dict[str, Any] = {}
        self._verdicts: dict[tuple[str, str, str], Any] = {}
        self._seconds: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._isolation: dict[str, str] = {}
        self._pool = None
        # id(task) -> (task, record, key): a task's record hashed once, however many samples ask
        # (the task is held, so its id is not reused while the entry lives).
        self._keyed: dict[int, tuple[Any, dict, str]] = {}

    def _key_of(self, task: Any) -> tuple[dict, str]:
        entry = self._keyed.get(id(task))
        if entry is None or entry[0] is not task:
            record = task.to_record()
            entry = self._keyed[id(task)] = (task, record, _task_key(record))
        return entry[1], entry[2]

    def env(self, name: str):
        if name not in self._envs:
            self._envs[name] = get_env(name, self.params)
        return self._envs[name]

    def prefetch(self, requests: Iterable[tuple[str, Any, str]]) -> None:
        """Verify every (environment, Task, completion) not verified yet, all environments at once."""

        pending: dict[str, dict[tuple[str, str, str], tuple[dict, str]]] = {}
        for env_name, task, completion in requests:
            record, task_key = self._key_of(task)
            key = (env_name, task_key, completion)
            if key not in self._verdicts:
                pending.setdefault(env_name, {}).setdefault(key, (record, completion))
        shards, keys = [], []
        for env_name in sorted(pending):
            items = list(pending[env_name].items())
            if self.env(env_name).uses_sandbox:
                ranges = split(len(items), self.shards)
            else:  # nothing to run in parallel: verified in one piece
                ranges = [range(len(items))]
            for r in ranges:
                chunk = items[r.start:r.stop]
                shards.append({"env": env_name, "tasks": [rec for _, (rec, _) in chunk],
                               "completions": [c for _, (_, c) in chunk]})
                keys.append([key for key, _ in chunk])
        if not shards:
            return

        for shard, shard_keys, result in zip(shards, keys, self._workers().map(shards)):
            env_name = shard["env"]
            for key, verdict in zip(shard_keys, result["verdicts"]):
                self._verdicts[key] = Verdict(**verdict)
            self._seconds[env_name] = self._seconds.get(env_name, 0.0) + result["seconds"]
            self._counts[env_name] = self._counts.get(env_name, 0) + len(shard_keys)
            if result["isolation"]:
                self._isolation[env_name] = result["isolation"]

    def verify_batch(self, name: str, tasks: Sequence[Any], completions: Sequence[str]) -> list:
        self.prefetch((name, task, completion) for task, completion in zip(tasks, completions))
        return [self._verdicts[(name, self._key_of(task)[1], completion)]
                for task, completion in zip(tasks, completions)]

    def isolation(self) -> dict[str, str]:
        return dict(sorted(self._isolation.items()))

    def verifications_per_s(self) -> dict[str, float]:
        """Per environment: verifications over the seconds its shards' workers spent on them."""
        return {env: round(self._counts[env] / seconds, 1) if seconds else 0.0
                for env, seconds in sorted(self._seconds.items())}

    def _workers(self):
        if self._pool is None:
            resources = shard_resources(self.params, gpus=False)
            # reward.workers 0 (one sandbox process per core): per worker, the cores it was given.
            sandbox_workers = self.params.reward.workers or self.executor.worker_cpus(resources)
            setup = {"params": self.params.model_dump(mode="json"), "sandbox_workers": sandbox_workers}
            self._pool = self.executor.pool(VERIFIER_WORKER, setup, resources)
        return self._pool

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> "ShardedVerifiers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
