"""Back a large zeroed pool with memory in the background, before requests write into it.

np.zeros maps pages lazily, so the first write to each page takes a page fault. On the
virtual machines this project runs on a fault on memory the VM has not touched since boot
costs ~40-90 µs per 4 KiB page (BENCHMARKS.md: 1 s per 100 MB), and it lands inside the
round that first writes a KV block: a 512-token prefill of SmolLM2 took 630 ms instead of
355, 263 ms of it in write_kv. llama.cpp clears its KV buffer when it creates a context, so
it pays that at start. Here a daemon thread asks Linux to populate the pool's pages
(madvise MADV_POPULATE_WRITE, Linux 5.14+): it changes no byte, so rounds may write the
pool meanwhile, and start-up does not wait. Where the call is not available nothing
happens and pages fault in as before. `Populate.wait` lets a benchmark start after it.
"""

from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np
import structlog

log = structlog.get_logger("zinfer.devices")

MADV_POPULATE_WRITE = 23
PAGE = 4096
CHUNK = 64 << 20  # bytes per madvise call: the thread stops between calls when the process exits


def _madvise() -> object | None:
    """libc's madvise, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None


class Populate:
    """The background population of some arrays' pages (see the module docstring)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self._done = threading.Event()
        self._ranges = [(a.ctypes.data, a.nbytes) for a in arrays if a.nbytes]
        self._keep = arrays  # the arrays outlive the thread's calls on their memory
        madvise = _madvise()
        if madvise is None or not self._ranges:
            self._done.set()
            return
        threading.Thread(target=self._run, args=(madvise,), name="zinfer-kv-populate", daemon=True).start()

    def _run(self, madvise: object) -> None:
        try:
            for addr, size in self._ranges:
                start = addr - addr % PAGE
                end = addr + size
                for lo in range(start, end, CHUNK):
                    length = min(CHUNK, end - lo)
                    if madvise(ctypes.c_void_p(lo), ctypes.c_size_t(length), MADV_POPULATE_WRITE) != 0:  # type: ignore[operator]
                        log.debug("kv pool populate unavailable", errno=ctypes.get_errno())
                        return
        finally:
            self._keep = []  # done with their memory: the pools may go when their owner drops them
            self._done.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s; whether the pages are populated (or will not be)."""
        return self._done.wait(timeout)
