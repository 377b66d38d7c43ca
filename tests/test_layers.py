"""The layout table's import rules (docs/architecture.md "Layers"), checked on the source with the AST.

Each top-level package may import only the layers below it; no two modules import each other, directly or round
a loop; and no function imports our own code to get round a cycle (only the `cli` entry points import inside
functions, so that a command loads only the stack it runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BELOW: dict[str, set[str]] = {
    "switchboard": set(),
    "routing": set(),
    "store": {"routing", "switchboard"},
    "activities": {"routing", "store", "switchboard"},
    "workflows": {"routing", "activities"},
    "runtime": {"switchboard", "routing", "store", "activities", "workflows"},
    "worker": {"switchboard", "routing", "store", "activities", "workflows", "runtime"},
    "api": {"switchboard", "routing", "store", "activities", "workflows", "runtime"},
    "cli": {"switchboard", "routing", "store", "activities", "workflows", "runtime", "worker", "api"},
}
LAZY_IMPORTS_ALLOWED = {"cli"}
DATA_PACKAGES = {"migrations"}  # files the wheel ships, no code


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {"worker": ROOT / "worker.py"}
    for package in BELOW:
        if (ROOT / package).is_dir():
            for path in (ROOT / package).rglob("*.py"):
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules of ours an import statement loads (a `from package import module` loads that module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert node.level == 0, "relative imports are not used in this codebase"
        base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return list(dict.fromkeys(n for n in names if n.split(".")[0] in BELOW))


class _Imports(ast.NodeVisitor):
    def __init__(self) -> None:
        self.top: list[tuple[int, str]] = []
        self.local: list[tuple[int, str]] = []
        self._depth = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for target in _targets(node):
            (self.local if self._depth else self.top).append((node.lineno, target))

    visit_Import = _import
    visit_ImportFrom = _import


def _imports(path: Path) -> _Imports:
    found = _Imports()
    found.visit(ast.parse(path.read_text(), str(path)))
    return found


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for name, path in MODULES.items():
        layer = name.split(".")[0]
        imports = _imports(path)
        for line, target in imports.top + imports.local:
            other = target.split(".")[0]
            if other != layer and other not in BELOW[layer]:
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line} imports {target} ({layer} may import {sorted(BELOW[layer])})"
                )
    assert not wrong, "\n".join(wrong)


def test_no_function_imports_our_own_code() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {target} inside a function"
        for name, path in MODULES.items()
        if name.split(".")[0] not in LAZY_IMPORTS_ALLOWED
        for line, target in _imports(path).local
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_modules() -> None:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        # A module's own packages are already importing when it runs; any other module it names loads in full.
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges[name] = {t for _, t in _imports(path).top if t != name and t not in ancestors and t in MODULES}
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                loop = [*stack[stack.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(loop))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_the_rules_cover_every_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} - {"tests", "bench", *DATA_PACKAGES}
    assert packages == set(BELOW) - {"worker"}


def test_the_tests_never_import_the_benchmarks() -> None:
    """bench/ may use the tests' helpers (the fault campaign in tests/faults/); the suite never depends on bench/."""
    wrong = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            wrong += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "bench"
            ]
    assert not wrong, "\n".join(wrong)
