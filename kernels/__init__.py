"""zinfer.kernels: the numerics of every device (numpy references, numba and LLVM IR CPU
kernels, CUDA sources), and TensorData, a tensor as a file stores it.

May import: no other zinfer folder. They know no model, device or wire.

Numba's on-disk cache (`cache=True`) drops an entry only when that function's own source
file changes, not when a function or constant it uses from another module does, so after
an edit or an upgrade a stale entry can silently run old arithmetic. So, unless NUMBA_CACHE_DIR
is set, the cache lives under the user's cache directory in a folder keyed by the hash of
every kernel source file and numba's version: any change starts a fresh cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def numba_cache_dir() -> Path:
    """The numba cache folder for exactly these kernel sources and this numba."""
    import numba
    import platformdirs

    digest = hashlib.sha256(numba.__version__.encode())
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return Path(platformdirs.user_cache_dir("zinfer")) / "numba" / digest.hexdigest()[:16]


def _use_keyed_numba_cache() -> None:
    """Point numba's cache at numba_cache_dir() before any kernel module compiles."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    try:
        import numba
    except ImportError:  # the numpy devices need no numba
        return
    numba.config.CACHE_DIR = str(numba_cache_dir())


def _compile_into_cache_first() -> None:
    """Kernels that miss the cache are compiled by a helper process and loaded from the
    cache, so the run that fills it computes what later runs do (kernels/compile_cache.py)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return
    from zinfer.kernels.cpu_fast import compile_cache

    compile_cache.route_compiles()


_use_keyed_numba_cache()
_compile_into_cache_first()
