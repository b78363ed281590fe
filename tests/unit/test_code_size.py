"""Issue 27's sizes, kept: no module of the package, the flows or the Prefect tasks over 500 lines, no
function over 80 (a module that grows past them splits by concept, as training/grpo_stats.py did)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p for base in ("closedloop", "flows", "tasks") for p in (ROOT / base).rglob("*.py"))
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_and_its_functions_stay_small(path):
    source = path.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(ROOT)}: {', '.join(long)}"
