"""The layering rules of ARCHITECTURE.md, made mechanical: one table of layers, no upward import, no
import cycle, the project's own modules imported at module level, each heavy library with one owner;
and the light import path of the CLI."""

import ast
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "closedloop"

# The layers, bottom to top: a module may import its own layer and those below, never one above. A
# module belongs to the layer of the longest path prefix that names it (a file or a folder, relative
# to the repository, without ".py"). Within a layer any direction is allowed; cycles never are.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plain records and files", ("closedloop/__init__", "closedloop/io", "closedloop/nested", "closedloop/faults",
                                 "closedloop/entries", "closedloop/workspace", "closedloop/stage_files",
                                 "closedloop/progress", "closedloop/runlock", "closedloop/batch_suite",
                                 "closedloop/sandbox/records", "closedloop/sandbox_limits",
                                 "closedloop/monitor_catalog")),
    ("configuration", ("closedloop/config",)),
    ("building blocks", ("closedloop/sandbox", "closedloop/models", "closedloop/execution", "closedloop/envs",
                         "closedloop/review", "closedloop/grading")),
    ("feedback, sampling, training, monitors", ("closedloop/rewards", "closedloop/sampling",
                                                "closedloop/training", "closedloop/monitors")),
    ("evaluation and the stage table", ("closedloop/evaluation", "closedloop/reports/__init__",
                                        "closedloop/reports/gate_report", "closedloop/reports/plots",
                                        "closedloop/pipeline")),
    ("adapters: DVC, MLflow, GX, git", ("closedloop/lineage",)),
    ("reports read from the records", ("closedloop/reports",)),
    ("an iteration's bookkeeping and the workspace commands", ("closedloop/versioning", "closedloop/rescore",
                                                                "closedloop/status", "closedloop/verify",
                                                                "closedloop/scaffold")),
    ("stages", ("closedloop/stages",)),
    ("Prefect tasks", ("tasks",)),
    ("Prefect flows", ("flows",)),
    ("the command line", ("closedloop/cli",)),
)
# The only imports of the project's own modules allowed inside functions: the CLI loads the Prefect
# layers when a subcommand needs them, as importing them imports prefect (a heavy library).
LAZY_ALLOWED = {("closedloop.cli", "flows"), ("closedloop.cli", "tasks")}
HEAVY = ("torch", "transformers", "mlflow", "great_expectations", "ray", "prefect", "vllm", "dvc", "pandas")
OWNERS = {  # a library → the only core modules allowed to import it
    "mlflow": ("closedloop/lineage/tracking",),
    "great_expectations": ("closedloop/lineage/validation",),
    "dvc": ("closedloop/lineage/dvc",),
    "ray": ("closedloop/execution/ray_backend",),
}
PROJECT_ROOTS = ("closedloop", "tasks", "flows")
FILES = sorted(path for root in PROJECT_ROOTS for path in (ROOT / root).rglob("*.py"))


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


MODULES = {module_name(path): path for path in FILES}


def layer_of(module: str) -> int:
    path = str(MODULES[module].relative_to(ROOT).with_suffix(""))
    best, found = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (path == prefix or path.startswith(prefix + "/")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found is not None, f"{path}.py is in no layer of LAYERS"
    return found


@lru_cache(maxsize=None)
def project_imports(module: str) -> tuple[tuple[str, int, bool], ...]:
    """(imported project module, line, inside a function?) for every import in ``module``'s source."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                           for alias in child.names]
            for target in targets:
                while target and target not in MODULES:  # `import closedloop.x.y` names the module x.y
                    target = target.rpartition(".")[0]
                if target and target != module:
                    found.append((target, child.lineno, nested))
            visit(child, inner)

    visit(tree, False)
    return tuple(found)


def third_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


IDS = [str(path.relative_to(ROOT)) for path in FILES]


@pytest.mark.parametrize("module", list(MODULES), ids=IDS)
def test_no_module_imports_a_layer_above_its_own(module):
    mine = layer_of(module)
    upward = [f"line {line}: {target} ({LAYERS[layer_of(target)][0]})"
              for target, line, _ in project_imports(module) if layer_of(target) > mine]
    assert not upward, f"{module} ({LAYERS[mine][0]}) imports layers above its own: {upward}"


@pytest.mark.parametrize("module", list(MODULES), ids=IDS)
def test_the_project_s_own_modules_are_imported_at_module_level(module):
    lazy = [f"line {line}: {target}" for target, line, nested in project_imports(module)
            if nested and (module, target.split(".")[0]) not in LAZY_ALLOWED]
    assert not lazy, f"{module} imports project modules inside functions (hides the graph): {lazy}"


def test_the_import_graph_has_no_cycle():
    graph = {module: {target for target, _, _ in project_imports(module)} for module in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path + [module, target]
            if target not in state:
                cycle = walk(target, path + [module])
                if cycle:
                    return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = walk(module, [])
            assert cycle is None, f"import cycle: {' -> '.join(cycle[cycle.index(cycle[-1]):])}"


def test_every_file_is_in_a_layer_and_the_table_names_real_paths():
    for module in MODULES:
        layer_of(module)
    for _, prefixes in LAYERS:
        for prefix in prefixes:
            assert (ROOT / f"{prefix}.py").is_file() or (ROOT / prefix).is_dir(), f"LAYERS names {prefix}, absent"


@pytest.mark.parametrize("path", [p for p in FILES if p.is_relative_to(CORE)], ids=lambda p: str(p.relative_to(ROOT)))
def test_core_never_imports_prefect_and_libraries_have_one_owner(path):
    relative = str(path.relative_to(ROOT).with_suffix(""))
    modules = third_party_imports(path)
    assert "prefect" not in modules, f"{relative}.py imports prefect; only tasks/ and flows/ may"
    for library, owners in OWNERS.items():
        if library in modules:
            assert any(relative == owner or relative.startswith(owner + "/") for owner in owners), (
                f"{relative}.py imports {library}; only {list(owners)} may")


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_heavy_libraries_are_imported_inside_functions(path):
    tree = ast.parse(path.read_text())
    at_top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            at_top.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            at_top.add(node.module.split(".")[0])
    allowed = {"prefect"} if not path.is_relative_to(CORE) else set()  # tasks/ and flows/ are Prefect code
    heavy = sorted((at_top & set(HEAVY)) - allowed)
    assert not heavy, f"{path.relative_to(ROOT)} imports {heavy} at module level; import them where they are used"


def test_help_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from closedloop.cli import build_parser\n"
        "build_parser().format_help()\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(heavy, time.perf_counter() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.startswith("[]"), out
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "closedloop.cli", "--help"], capture_output=True, check=True, cwd=ROOT)
    assert time.perf_counter() - started < 3.0  # generous for a loaded CI machine; ~0.5 s measured
