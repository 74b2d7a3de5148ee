"""The layer rules of the package, checked over its import graph (each folder's __init__.py
states its own rules; test_docstrings_state_the_rules keeps them and LAYERS in step).

Layers, top to bottom: gateway -> actors -> models -> devices -> kernels; a folder imports
only folders below it. messages/ (the wire) and traces/ (spans and logs) sit beside that
stack: only actors/ and gateway/ import them, and they import no other folder. Narrower:
only the executor and the engine's modules in actors/ (they run and build the device) and
the forward pass in models/ import devices/, and gateway/ imports from actors/ only
zinfer.actors.engine, the engine's public face (it talks to the actors over messages/).

The graph is read from the source with ast, so nothing is imported here. Every import is an
edge: at module level, under `if TYPE_CHECKING:` and inside functions. The modules import
each other in no cycle, and an import inside a function is of an optional dependency only.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

LAYERS: dict[str, set[str]] = {  # folder -> the folders it may import
    "gateway": {"actors", "models", "devices", "kernels", "messages", "traces"},
    "actors": {"models", "devices", "kernels", "messages", "traces"},
    "models": {"devices", "kernels"},
    "devices": {"kernels"},
    "kernels": set(),
    "messages": set(),
    "traces": set(),
}

DEVICE_USERS = {
    "actors": {"zinfer.actors.executor_actor", "zinfer.actors.draft_actor",
               *(f"zinfer.actors.{m}" for m in ("engine", "engine_config", "engine_build"))},
    "models": {"zinfer.models.forward"},
}
"""The modules of actors/ and models/ that may import devices/: the executors (the target's and a
draft model's) run rounds on their devices and the engine's modules build them; the forward pass
runs on the device protocol. The spec and the weight readers know no device (their TensorData
lives in kernels/)."""
ACTORS_FOR_THE_GATEWAY = {"zinfer.actors.engine"}
"""What gateway/ may import from actors/: open_engine, EngineConfig, Engine."""

OPTIONAL = {
    "cupy": "the cuda extra: a host without an NVIDIA GPU runs without it",
    "llama_cpp": "the llama extra: `zinfer bench --compare-llama-cpp` only",
    "opentelemetry.exporter.otlp": "the otlp extra: only with --otlp-endpoint",
    "ray": "the ray extra: only with `zinfer serve --replicas` (gateway/replicas.py, replica_actor.py)",
}
"""Third-party packages imported where they are needed, inside a function: why each is optional."""

KNOWN_CYCLES: list[set[str]] = []
"""Cycles that exist while their owners rework them: a cycle must lie within one of these."""

KNOWN_FUNCTION_IMPORTS: dict[str, set[str]] = {
    # numba: cpu-fast, and the probe of whether its kernels compile here, are imported only when
    # asked for, so the numpy devices run where numba fails to import (cupy is in OPTIONAL)
    "zinfer.devices.registry": {
        "numba",
        "zinfer.devices.cpu_fast",
        "zinfer.kernels.cpu_fast.cpu_quant",
        "zinfer.kernels.cpu_fast.gemm_ir",
    },
}
"""Function-level imports of required dependencies that remain, by importing module."""


@dataclass(frozen=True)
class Import:
    importer: str  # zinfer.folder.module
    target: str  # the module imported (zinfer.* or third-party)
    line: int
    in_function: bool

    def where(self) -> str:
        return f"{self.importer}:{self.line} -> {self.target}"


def folder_of(module: str) -> str:
    return module.split(".")[1]


def read_modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> source file."""
    modules = {}
    for package, directory in PACKAGE_DIRS.items():
        root = REPO / directory
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join((package, *parts[:-1]) if parts[-1] == "__init__" else (package, *parts))] = path
    return modules


def imports_in(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of one module, each resolved to the module it loads."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for a in child.names:  # `from pkg import module` imports pkg.module
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    found.append(Import(module, target, child.lineno, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


MODULES = read_modules()
IMPORTS = [i for name, path in MODULES.items() for i in imports_in(name, path, MODULES)]
INTERNAL = [i for i in IMPORTS if i.target in MODULES]


def layer_violation(i: Import) -> str | None:
    """Which rule the import breaks, or None."""
    src, dst = folder_of(i.importer), folder_of(i.target)
    if src == dst:
        return None
    if dst not in LAYERS[src]:
        return f"{src}/ may not import {dst}/"
    if dst == "devices" and src in DEVICE_USERS and i.importer not in DEVICE_USERS[src]:
        return f"in {src}/ only {', '.join(sorted(DEVICE_USERS[src]))} import devices/"
    if (src, dst) == ("gateway", "actors") and i.target not in ACTORS_FOR_THE_GATEWAY:
        return "gateway/ imports from actors/ only zinfer.actors.engine"
    return None


def test_the_graph_is_read():
    assert {folder_of(m) for m in MODULES} == set(LAYERS)
    assert any(i.in_function for i in IMPORTS) and len(INTERNAL) > 200  # both kinds of import are seen


def test_no_import_goes_up_the_layers():
    broken = [f"{i.where()}: {why}" for i in INTERNAL if (why := layer_violation(i))]
    assert not broken, "\n".join(broken)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_cycles():
    graph: dict[str, set[str]] = defaultdict(set)
    for i in INTERNAL:
        if i.target != i.importer:
            graph[i.importer].add(i.target)
            graph[i.target]
    new = [c for c in strongly_connected(graph) if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, "modules that import each other: " + "; ".join(" <-> ".join(sorted(c)) for c in new)


def is_allowed_in_function(i: Import) -> bool:
    if any(i.target == name or i.target.startswith(name + ".") for name in OPTIONAL):
        return True
    known = KNOWN_FUNCTION_IMPORTS.get(i.importer, set())
    return "*" in known or i.target in known or i.target.split(".")[0] in known


def test_function_level_imports_are_of_optional_dependencies():
    hidden = [i.where() for i in IMPORTS if i.in_function and not is_allowed_in_function(i)]
    assert not hidden, "import at module level (or name the optional dependency in OPTIONAL):\n" + "\n".join(hidden)


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_docstrings_state_the_rules(folder):
    """Each folder's __init__.py says what it may import, as LAYERS does."""
    package = f"zinfer.{folder}"
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    said = re.search(r"May import: ([^.]*)\.", re.sub(r"\([^)]*\)", "", doc))  # (asides) narrow a rule
    assert said, f"{PACKAGE_DIRS[package]}/__init__.py states no 'May import: ...' rule"
    names = set(re.findall(r"\b(" + "|".join(LAYERS) + r")\b", said.group(1)))
    assert names == LAYERS[folder], f"{folder}/__init__.py: may import {sorted(names)}; LAYERS {sorted(LAYERS[folder])}"
