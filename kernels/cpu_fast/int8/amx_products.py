"""The int8 products of rounds with many rows on AMX tiles: activations rounded for the tile
kernels, the parallel driver over (weight rows, activation rows) tasks, and the kernels'
compile. products.py calls `product` for a launch of at least MIN_ROWS activation rows (a whole tile)
whose matrices all have a tile layout (amx_layout.py); fewer rows keep the VNNI kernels.

The activations are the VNNI kernels' codes (rounded per 32 columns, per 256 for the
K-quants, by the same rule: activations._block_scale), laid out plainly: A [T_pad, cols]
int8, S [T_pad, cols / group] f32 = d_a of each rounding group, N [T_pad, cols / 32] f32 per
32-block: group 32, f32(d_a * f32(code sum)) (u4's offsets' factor N_b); group 256, the exact
integer code sum (k4's Msum); T_pad = T rounded up to 32, the pad rows
zero (the kernels read whole tiles). The kernels (amx_ir.py) apply them in the one int8
float order (tests/int8_canonical.py), so a row's result is the VNNI kernels' bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from zinfer.kernels.cpu_fast import code_cache, llvm_host
from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_ir
from zinfer.kernels.cpu_fast.int8.activations import _block_scale
from zinfer.kernels.cpu_fast.int8.amx_ir import AmxArgs
from zinfer.kernels.cpu_fast.int8.tasks import first_tasks, job_of
from zinfer.kernels.cpu_fast.int8.amx_layout import ROW_MULTIPLE, AmxWeight
from zinfer.kernels.cpu_fast.kernel_signature import call_kernel
from zinfer.kernels.cpu_fast.numba_types import Int

# activation rows of a launch from which the tiles beat the VNNI kernels (BENCHMARKS.md: measured per row count)
MIN_ROWS = 16
ROWS_PER_TASK = 32  # weight rows per parallel task (one kernel step)
ACT_ROWS_PER_TASK = 128  # activation rows per parallel task
PAD_ROWS = 32  # the kernels' step of activation rows
# columns of a job row: the weights' tiles, scales, offsets, sub-block scales and mins,
# tile products per row, rows, where its product starts in `out` (at T * first_row floats,
# a C-contiguous [T, rows] block), its kernel
_B, _D, _M, _SC, _MN, _NBLOCKS, _ROWS, _FIRST_ROW, _KERNEL = range(9)
JOB_COLUMNS = 9


@functools.cache
def addresses() -> dict[str, int] | None:
    """The machine-code address of each kernel of amx_ir.KINDS, kind -> address; None where
    this process may not run AMX tiles (amx_host) or llvmlite cannot compile them."""
    if not amx_host.tiles_permitted():
        return None
    try:
        names = [amx_ir.kernel_name(kind) for kind in amx_ir.KINDS]
        addr = llvm_host.compile_for_host(amx_ir.module_ir(), names, cache_dir=code_cache.llvm_dir())
    except (RuntimeError, OSError):
        return None
    return {kind: addr[amx_ir.kernel_name(kind)] for kind in amx_ir.KINDS}


def job_table(ws: list[AmxWeight], first_rows: list[int]) -> np.ndarray | None:
    """The AMX jobs [n, JOB_COLUMNS] int64 of matrices whose activations round alike (one
    AmxWeight.group), each at its first row of the stacked output, or None when the tiles do
    not run here."""
    addr = addresses()
    if addr is None or len({w.group for w in ws}) != 1:
        return None
    return np.array([
        (w.codes.ctypes.data, w.d.ctypes.data, w.m.ctypes.data, w.sc.ctypes.data, w.mn.ctypes.data, w.nblocks,
         w.codes.shape[0] * 16, row, addr[w.kind])
        for w, row in zip(ws, first_rows)
    ], np.int64)


@cached_njit(parallel=True, nogil=True, fastmath={"reassoc", "nsz", "nnan", "ninf"})
def _quantize(x: np.ndarray, group: Int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [T, cols] f32 -> (A [T_pad, cols] int8, S [T_pad, cols / group] f32, N [T_pad,
    cols / 32] f32): the module docstring's activations, rounded per `group` columns (32 or 256)."""
    T, K = x.shape
    padded = (T + PAD_ROWS - 1) // PAD_ROWS * PAD_ROWS
    A = np.empty((padded, K), np.int8)
    S = np.empty((padded, K // group), np.float32)
    N = np.empty((padded, K // 32), np.float32)
    A[T:] = 0
    S[T:] = 0
    N[T:] = 0
    for t in prange(T):
        xt, At = x[t], A[t]
        for g in range(K // group):
            d, inv = _block_scale(xt[g * group : g * group + group])
            S[t, g] = d
            for b in range(g * group // 32, (g + 1) * group // 32):
                total = np.float32(0)  # exact: at most 32 * 127
                for i in range(b * 32, b * 32 + 32):
                    c = np.rint(xt[i] * inv)
                    At[i] = np.int8(c)
                    total += c
                N[t, b] = d * total if group == 32 else total
    return A, S, N


@cached_njit(parallel=True, nogil=True)
def _run(jobs: np.ndarray, A: np.ndarray, S: np.ndarray, N: np.ndarray, T: Int, out: np.ndarray) -> None:
    """Each job's product [T, rows] into its block of the flat buffer out, by tasks of
    ROWS_PER_TASK weight rows x ACT_ROWS_PER_TASK activation rows."""
    n_t = (T + ACT_ROWS_PER_TASK - 1) // ACT_ROWS_PER_TASK
    first = first_tasks(jobs[:, _ROWS], ROWS_PER_TASK)
    n_r = first[-1]
    for task in prange(n_r * n_t):
        tb, c = task // n_r, task % n_r
        j = job_of(first, c)
        job = jobs[j]
        r0 = (c - first[j]) * ROWS_PER_TASK
        t0 = tb * ACT_ROWS_PER_TASK
        call_kernel(job[_KERNEL], AmxArgs(
            B=job[_B], D=job[_D], M=job[_M], SC=job[_SC], MN=job[_MN], A=A.ctypes.data, S=S.ctypes.data,
            N=N.ctypes.data, nblocks=job[_NBLOCKS], r0=r0, r1=r0 + ROWS_PER_TASK, t0=t0,
            t1=min(T, t0 + ACT_ROWS_PER_TASK), astride=A.strides[0], sstride=S.strides[0], nstride=N.strides[0],
            out=out.ctypes.data + T * job[_FIRST_ROW] * 4, ostride=job[_ROWS]))


def product(jobs: np.ndarray, x: np.ndarray, group: int, out: np.ndarray) -> None:
    """out (flat f32, each job's [T, rows] at T * its first row) = x [T, cols] f32 times
    each job's matrix, x rounded per `group` columns (32 or 256: the jobs' AmxWeight.group)."""
    assert ROWS_PER_TASK == ROW_MULTIPLE
    A, S, N = _quantize(x, group)
    _run(jobs, A, S, N, x.shape[0], out)
