"""Where compiled kernels are kept between runs, and under what key: one scheme for every
on-disk cache of compiled code in kernels/.

An entry is keyed by everything its machine code depends on: what it is compiled from,
the compiler and its version, and the host CPU (its name and LLVM feature string), so a
change to any of them starts a fresh entry and stale code never runs:

- numba's cache of the `cache=True` kernels (cached_njit). numba drops an entry only when
  the function's own source file changes, not when a function or constant it uses from
  another module does, so after an edit or an upgrade a stale entry could silently run old
  arithmetic. Their folder, numba_dir(), is keyed by every source file of kernels/, numba
  and the CPU. It is numba's config.CACHE_DIR only while a kernel is decorated: a host
  process's own numba functions keep their cache where they had it. A CACHE_DIR already
  set (NUMBA_CACHE_DIR, a test's folder) is used as it is.
- the object code of the LLVM IR kernels (llvm_host.compile_for_host): one file per
  module, object_name(ir_text), in llvm_dir(), keyed by the IR text, llvmlite and the CPU.

cupy's cache of the CUDA modules (kernels/cuda/modules.py) is cupy's own: it keys by the
source text (the headers inlined), the compile options, the GPU architecture and its own
and CUDA's versions, which is this scheme already. The weight cache of models/ keys data,
not code (models/weight_cache.py).

Everything lives under the user's cache directory: <cache>/zinfer/numba/<key>/ and
<cache>/zinfer/llvm/<key>.o.

numba's cache is not safe across processes: saving a new signature reads the function's
index, picks the next free data file and writes both, with no lock, so two processes that
compile the same kernel for different argument types at once (two test workers, two
replicas on a cold cache) can leave an index naming one signature's file holding the
other's code, which then runs on the wrong arrays and crashes. `guard_numba_cache` puts
an exclusive file lock around each save and a shared one around each load.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import threading
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import llvmlite.binding as llvm
import numba
import numba.core.caching as numba_caching
import platformdirs

KERNELS = Path(__file__).resolve().parents[1]  # kernels/, every file of which numba_dir() hashes
KEY_CHARS = 24  # hex digits of a key
F = TypeVar("F", bound=Callable[..., Any])
NUMBA_CONFIG: Any = numba.config  # its settings are attributes it sets at run time, unseen by mypy

_decorating = threading.Lock()  # numba's config.CACHE_DIR is process-wide while a kernel is decorated


def cache_root() -> Path:
    """<the user's cache directory>/zinfer."""
    return Path(platformdirs.user_cache_dir("zinfer"))


@functools.cache
def host_cpu() -> str:
    """The host CPU as LLVM compiles for it: its name and feature string."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return f"{llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}"


def code_key(source: bytes, compiler: str) -> str:
    """The key of code compiled from `source` by `compiler` (a package name: its installed
    version counts) for the host CPU."""
    digest = hashlib.sha256()
    for part in (compiler.encode(), version(compiler).encode(), host_cpu().encode(), source):
        digest.update(part + b"\0")
    return digest.hexdigest()[:KEY_CHARS]


@functools.cache
def _kernel_sources() -> bytes:
    """The name and text of every source file of kernels/, in one string."""
    paths = sorted(KERNELS.rglob("*.py"))
    return b"".join(path.relative_to(KERNELS).as_posix().encode() + b"\0" + path.read_bytes() for path in paths)


def numba_dir() -> Path:
    """numba's cache folder for zinfer's kernels: config.CACHE_DIR where one is set, else
    the folder keyed by kernels/'s sources, numba and the CPU."""
    if NUMBA_CONFIG.CACHE_DIR:
        return Path(NUMBA_CONFIG.CACHE_DIR)
    return cache_root() / "numba" / code_key(_kernel_sources(), "numba")


def llvm_dir() -> Path:
    """The folder of the LLVM IR kernels' object files."""
    return cache_root() / "llvm"


def object_name(ir_text: str) -> str:
    """The object file of a module of IR, compiled by llvmlite for the host CPU."""
    return f"{code_key(ir_text.encode(), 'llvmlite')}.o"


def cached_njit(**flags: Any) -> Callable[[F], F]:
    """numba.njit(cache=True, **flags), its cache in numba_dir(). The returned function is
    numba's dispatcher (typed as the function it compiles)."""

    def decorate(func: F) -> F:
        with _decorating:
            chosen = NUMBA_CONFIG.CACHE_DIR
            NUMBA_CONFIG.CACHE_DIR = str(numba_dir())
            try:
                kernel: F = numba.njit(cache=True, **flags)(func)
            finally:
                NUMBA_CONFIG.CACHE_DIR = chosen
        return kernel

    return decorate


def _under_lock(method: Callable[..., Any], kind: int) -> Callable[..., Any]:
    """numba's IndexDataCacheFile `method`, run holding a `kind` flock on its index's lock file."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any) -> Any:
        os.makedirs(self._cache_path, exist_ok=True)
        with open(self._index_path + ".lock", "a") as lock:
            fcntl.flock(lock, kind)
            return method(self, *args)

    locked.__zinfer_locked__ = True  # type: ignore[attr-defined]
    return locked


def guard_numba_cache() -> None:
    """Lock numba's cache index (the module docstring): saves exclusive, loads shared. Idempotent."""
    files: Any = numba_caching.IndexDataCacheFile
    if not getattr(files.save, "__zinfer_locked__", False):
        files.save = _under_lock(files.save, fcntl.LOCK_EX)
        files.load = _under_lock(files.load, fcntl.LOCK_SH)


guard_numba_cache()
