"""A KV pool's pages are backed in the background without a byte changed
(devices/memory_populate.py), and a cpu-fast device's settle waits for it."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.devices.memory_populate import PAGE, Populate

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_POPULATE_WRITE) is Linux's")


def resident_pages(a: np.ndarray) -> int:
    """How many of a's whole pages are in memory (mincore)."""
    start = -(-a.ctypes.data // PAGE) * PAGE
    pages = (a.ctypes.data + a.nbytes - start) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * PAGE), vec) == 0
    return sum(v & 1 for v in vec)


@linux
def test_populate_backs_every_page_and_keeps_what_was_written():
    pool = np.zeros((64 << 20) // 4, np.float32)  # 64 MiB, mapped lazily
    assert resident_pages(pool) < pool.nbytes // PAGE // 2
    pool[:: 3 * PAGE // 4] = 7.0  # a write in every third page, before and while it runs
    job = Populate([pool])
    pool[1 :: 5 * PAGE // 4] = 5.0
    assert job.wait(120)
    assert resident_pages(pool) >= pool.nbytes // PAGE - 1
    assert np.all(pool[:: 3 * PAGE // 4] == 7.0) and np.all(pool[1 :: 5 * PAGE // 4] == 5.0)
    untouched = np.ones(pool.size, bool)
    untouched[:: 3 * PAGE // 4] = untouched[1 :: 5 * PAGE // 4] = False
    assert not pool[untouched].any()


@linux
def test_a_cpu_fast_pool_is_populated_by_the_time_the_device_settles():
    dev = FastCpuDevice(decode_graphs=False)
    kv = dev.alloc_kv(2, 2, 64, 512, 16)  # 2 layers x K, V of 2 MiB (f16)
    assert dev.settle(120)
    for a in kv.k + kv.v:
        assert resident_pages(a) >= a.nbytes // PAGE - 1
        assert not a.any()
