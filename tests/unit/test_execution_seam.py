"""The executor seam's pure parts: how work is cut into shards, the local pool, the config keys."""

from __future__ import annotations

import pytest

from closedloop.config import ConfigError, parse_params
from closedloop.execution.base import load, split


@pytest.mark.parametrize("count,shards,unit", [(10, 3, 2), (10, 1, 4), (7, 5, 1), (3, 8, 1), (100, 7, 32), (0, 3, 2)])
def test_split_covers_every_item_once_in_order_on_unit_boundaries(count, shards, unit):
    ranges = split(count, shards, unit)
    assert [i for r in ranges for i in r] == list(range(count))
    assert len(ranges) <= shards and all(len(r) for r in ranges)
    assert all(r.start % unit == 0 for r in ranges)


def test_split_balances_whole_units():
    assert [len(r) for r in split(10, 3, 2)] == [2, 4, 4]  # 5 batches of 2 prompts: 1, 2, 2
    assert [len(r) for r in split(9, 3, 1)] == [3, 3, 3]


def test_split_refuses_nonsense():
    with pytest.raises(ValueError):
        split(10, 0, 1)


def test_load_names_what_it_expected():
    with pytest.raises(ValueError, match="package.module:name"):
        load("closedloop.execution.base")


class Doubler:
    closed = []

    def __init__(self, setup):
        self.factor = setup["factor"]

    def run(self, shard):
        return [x * self.factor for x in shard["xs"]]

    def close(self):
        Doubler.closed.append(self)


def test_the_local_pool_builds_one_worker_and_returns_results_in_order():
    from closedloop.execution.local import LocalExecutor

    with LocalExecutor() as executor, executor.pool(f"{__name__}:Doubler", {"factor": 2}) as pool:
        assert pool.map([{"xs": [1, 2]}, {"xs": []}, {"xs": [5]}]) == [[2, 4], [], [10]]
        assert executor.call("builtins:len", {"a": 1, "b": 2}) == 2
    assert len(Doubler.closed) == 1


def test_execution_keys_are_checked():
    assert parse_params({}).execution.backend == "local"
    with pytest.raises(ConfigError, match="execution.backend"):
        parse_params({"execution": {"backend": "slurm"}})
    with pytest.raises(ConfigError, match="execution.shards"):
        parse_params({"execution": {"shards": 0}})
    with pytest.raises(ConfigError, match="execution.ray.wrokers"):
        parse_params({"execution": {"ray": {"wrokers": 2}}})


def test_an_unreachable_cluster_fails_at_once_naming_the_key():
    import socket
    import time

    from closedloop.execution.base import ExecutionError
    from closedloop.execution.factory import open_executor

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    params = parse_params({"execution": {"backend": "ray", "ray": {"address": f"127.0.0.1:{port}"}}})
    started = time.perf_counter()
    with pytest.raises(ExecutionError, match=f"execution.ray.address 127.0.0.1:{port}: nothing answers"):
        open_executor(params)
    assert time.perf_counter() - started < 10
