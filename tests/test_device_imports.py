"""The devices/ modules import each other without a circle, and hide no import in a function.

Read from the source (ast), so no import runs: every `zinfer.devices.*` import, at module
level or inside a function, is an edge of the graph, and the graph must have no cycle. A
function-level import is for an optional dependency only (cupy, which a host without a GPU
lacks), or in registry.py, the factory that builds the device asked for (and probes
whether numba's kernels compile here) without importing every device's dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

import zinfer.devices

DEVICES = Path(zinfer.devices.__file__).parent
OPTIONAL = {"cupy"}  # third-party modules a device may import where it needs them
LAZY_FACTORY = "registry"  # builds devices by name: imports each where it is asked for


def imported_modules(node: ast.AST, module: str) -> list[str]:
    """The modules an import node names (relative imports resolved against zinfer.devices.module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        base = ".".join(f"zinfer.devices.{module}".split(".")[: -node.level] + ([base] if base else []))
    if base == "zinfer.devices":
        return [f"zinfer.devices.{a.name}" for a in node.names]
    return [base]


def imports_of(path: Path) -> tuple[set[str], list[str]]:
    """(every module path imports, those imported inside a function)."""
    tree = ast.parse(path.read_text())
    every: set[str] = set()
    in_functions: list[str] = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    in_functions += imported_modules(node, path.stem)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            every.update(imported_modules(node, path.stem))
    return every, in_functions


def test_devices_import_each_other_without_a_circle():
    graph = {}
    for path in sorted(DEVICES.glob("*.py")):
        every, _ = imports_of(path)
        graph[path.stem] = {m.removeprefix("zinfer.devices.") for m in every if m.startswith("zinfer.devices.")}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            raise AssertionError("an import circle: " + " -> ".join(trail[trail.index(name):] + [name]))
        if name not in done:
            for dep in sorted(graph.get(name, ())):
                visit(dep, trail + [name])
            done.add(name)

    for name in graph:
        visit(name, [])
    assert {"cpu_fast", "cpu_graph", "cpu_graph_recorder", "cuda", "cuda_graph"} <= set(graph)


def test_function_level_imports_are_optional_dependencies_only():
    hidden = {}
    for path in sorted(DEVICES.glob("*.py")):
        _, in_functions = imports_of(path)
        if path.stem != LAZY_FACTORY:
            wrong = [m for m in in_functions if m.split(".")[0] not in OPTIONAL]
            if wrong:
                hidden[path.name] = wrong
    assert hidden == {}
