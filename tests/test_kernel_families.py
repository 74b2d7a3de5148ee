"""kernels/ by family (kernels/__init__.py): oracle/, llama_cpp/, cpu_fast/ and cuda/ import
oracle/ and tensor.py and no other family; and importing any of them changes nothing in the
process: numba's Dispatcher.compile is routed, and its cache folder set, only when a cpu-fast
device asks (kernels/cpu_fast/compile_cache.route_compiles, code_cache.cached_njit)."""

from __future__ import annotations

import os
import subprocess
import sys

from test_import_graph import INTERNAL

SHARED = {"oracle", "tensor"}  # what every family may import


def family(module: str) -> str | None:
    """zinfer.kernels.<family>[...] -> family; None outside kernels/ or for kernels' own __init__."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["zinfer", "kernels"] and len(parts) > 2 else None


def test_families_import_only_the_oracle_and_tensor():
    crossing = [
        i.where()
        for i in INTERNAL
        if (src := family(i.importer)) and (dst := family(i.target)) and src != dst and dst not in SHARED
    ]
    assert not crossing, "\n".join(crossing)
    assert not [i.where() for i in INTERNAL if family(i.importer) in SHARED and family(i.target) not in (None, *SHARED)]


_IMPORT_EVERY_KERNEL = """
import pkgutil, importlib, numba
from numba.core.dispatcher import Dispatcher
import zinfer.kernels as k
before = (Dispatcher.compile, numba.config.CACHE_DIR)
for m in pkgutil.walk_packages(k.__path__, "zinfer.kernels."):
    importlib.import_module(m.name)
assert (Dispatcher.compile, numba.config.CACHE_DIR) == before, "importing kernels changed numba"
from zinfer.kernels.cpu_fast import compile_cache
compile_cache.route_compiles()
assert getattr(Dispatcher.compile, "zinfer_routed", False)
print("ok")
"""


def test_importing_the_kernels_changes_nothing_in_numba():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERY_KERNEL], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
