"""The layering rule of ARCHITECTURE.md, made mechanical; and the light import path of the CLI."""

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "closedloop"
OWNERS = {  # a library → the only core module allowed to import it
    "mlflow": {"closedloop/lineage/tracking.py"},
    "great_expectations": {"closedloop/lineage/validation.py"},
    "dvc": {"closedloop/lineage/dvc.py"},
    "ray": {"closedloop/execution/ray_backend.py"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


# The `closedloop` command lives in the package but sits above the flows: it is the one core file
# that may launch them (lazily, inside its subcommands; it never imports prefect itself).
ENTRY_POINT = "closedloop/cli.py"
CORE_FILES = sorted(CORE.rglob("*.py"))


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_never_imports_prefect_and_libraries_have_one_owner(path):
    relative = str(path.relative_to(ROOT))
    modules = imported_modules(path)
    assert "prefect" not in modules, f"{relative} imports prefect; only tasks/ and flows/ may"
    if relative != ENTRY_POINT:
        assert not modules & {"tasks", "flows"}, f"{relative} imports the Prefect layers; dependencies point one way"
    for library, owners in OWNERS.items():
        if library in modules:
            assert relative in owners, f"{relative} imports {library}; only {sorted(owners)} may"


@pytest.mark.parametrize("path", sorted((ROOT / "tasks").rglob("*.py")), ids=lambda p: p.name)
def test_tasks_do_not_import_flows(path):
    assert "flows" not in imported_modules(path)


def test_help_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from closedloop.cli import build_parser\n"
        "build_parser().format_help()\n"
        "heavy = [m for m in ('torch', 'transformers', 'mlflow', 'great_expectations', 'prefect', 'dvc', 'pandas', 'ray')"
        " if m in sys.modules]\n"
        "print(heavy, time.perf_counter() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.startswith("[]"), out
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "closedloop.cli", "--help"], capture_output=True, check=True, cwd=ROOT)
    assert time.perf_counter() - started < 2.0  # generous for a loaded CI machine; ~0.1 s measured
