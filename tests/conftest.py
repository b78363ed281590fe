"""Shared fixtures: tiny params, a real workspace (git + DVC) in a temp dir, a real Prefect API."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see closedloop/cli.py: spinning threads collapse under load
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.pop("MLFLOW_TRACKING_URI", None)

from tests.tiny import TINY  # noqa: E402  (re-exported: tests import it from here)


def tiny_params(**overrides):
    from closedloop.config import parse_params

    import copy

    data = copy.deepcopy(TINY)
    for key, value in overrides.items():
        data.setdefault(key, {}).update(value)
    return parse_params(data)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh closedloop workspace with tiny params: real git, real DVC, a local DVC remote."""
    import yaml

    from closedloop.scaffold import init_workspace

    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    init_workspace(root)
    return root


@pytest.fixture(scope="session")
def prefect_api() -> str:
    """One real Prefect API server for the whole test run; yields its URL, which the CLI tests pass as
    PREFECT_API_URL to `closedloop run` where they do not test Prefect's own ephemeral start (each
    such start on a new workspace costs about 25 s of migrations on 2 cores)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def warm_template(prefect_api, tmp_path_factory) -> tuple[Path, dict]:
    """One warm start for the whole test run: a real `init_workspace` and the closed-loop flow with 0
    iterations (benchmark, warm start, its DVC records, MLflow run and registry version 1) on the tiny
    params, against the test run's Prefect API. Yields its root and the flow's result. Tests take copies
    (`warm_copy`); nothing may change the template itself."""
    import yaml

    from closedloop.scaffold import init_workspace
    from flows.loop import closed_loop

    root = tmp_path_factory.mktemp("warm-template") / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    init_workspace(root)
    return root, closed_loop(iterations=0, workspace=str(root))


@pytest.fixture(scope="session")
def warm_copy(warm_template):
    """``warm_copy(dest, overrides=None)``: a copy of the warm-started template at ``dest`` with its
    absolute paths rebased and ``overrides`` ({section: {key: value}}) laid over its params.yaml
    (tests/warm.py). Overrides must leave the benchmark and warm-start stages' params alone: the copy's
    warm start is the template's. Saves a warm start (about 30-60 s on 2 cores) per workspace."""
    from tests.warm import copy_warm_workspace

    def make(dest: Path, overrides: dict | None = None) -> Path:
        return copy_warm_workspace(warm_template[0], dest, overrides)

    return make


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine, two threads that wait on each other made tiny
    models up to 10x slower whenever another process was busy; results do not depend on it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Test modules that start Ray (a local cluster or `ray start`): under pytest-xdist they share one worker.
RAY_MODULES = {"tests/stages/test_execution.py", "tests/flows/test_ray_flow.py"}


def test_group(nodeid: str) -> str:
    """The pytest-xdist work unit a test belongs to: its module, or "ray" for the modules that start Ray."""
    module = nodeid.split("::", 1)[0]
    return "ray" if module in RAY_MODULES else module


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs two pytest-xdist workers: the suite is about half idle waits (processes starting,
    servers answering), so two at a time fill a 2-core machine. Each test module runs whole on one
    worker, so its module-scoped fixtures (test_resume's uninterrupted reference iteration,
    test_execution's local batch, test_ray_flow's two flows) are built once; the modules that start Ray
    share one worker, so two local Rays never start at once (a stage's default Ray would join the
    other's `ray start` cluster, and each asks for more CPUs than half the machine).

    A scheduler of our own, not `--dist loadgroup` with xdist_group marks: under pytest 9 those marks
    no longer reach xdist 3.8's scheduler (the group suffix it writes into the test id is lost), so
    every module was spread over both workers and built its module fixtures twice."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return test_group(nodeid)

    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """The Ray group first (every worker collects in this same order, and `make test` keeps it with
    --no-loadscope-reorder): it is the longest chain of tests that must run one after another, so it
    starts while the other worker takes the rest, the whole-loop modules (e2e, flows) before the units."""
    items.sort(key=lambda item: test_group(item.nodeid) != "ray")  # stable: each module keeps its order
