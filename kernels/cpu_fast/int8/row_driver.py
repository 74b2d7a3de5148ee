"""The parallel launch of the int8 row kernels and outer products (products.py's matmul and
matmul_many): one job row per weight matrix, and `run_jobs`, which splits the jobs' weight
rows into tasks (tasks.py) and calls each task's kernels tile by tile."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numba import prange

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.int8 import ir, ir_outer
from zinfer.kernels.cpu_fast.int8.ir import Int8Args
from zinfer.kernels.cpu_fast.int8.tasks import first_tasks, job_of
from zinfer.kernels.cpu_fast.kernel_signature import call_kernel

ROWS_PER_TASK = 16  # weight rows per parallel task
ROWS_PER_BLOCK = 128  # activation rows per parallel task (an outer-product task converts its weight rows once a task)

# columns of a job row: one weight matrix, where its product starts in `out` (at
# T * first_row floats, as a C-contiguous [T, rows] block), the addresses of its
# layout's kernels in ir.SHAPES' order, then of its outer-product prefill kernels
# (u5, k4, u6: convert, product, and their scratch bytes per weight row and step; others 0, 0, 0)
_W, _D, _M, _WSTRIDE, _DSTRIDE, _ROWS, _FIRST_ROW, _KERNELS = range(8)
_KTILE, _KROWS = ir.TILE, ir.ROWS
assert ir.SHAPES == ((1, 1), (1, _KROWS), (2, 1), (2, _KROWS), (_KTILE, 1), (_KTILE, _KROWS))
_CONVERT, _OUTER, _SCRATCH = _KERNELS + 6, _KERNELS + 7, _KERNELS + 8
JOB_COLUMNS = _SCRATCH + 1  # 7 columns, 6 row-kernel addresses, 3 of the outer products
_OUTER_ROWS = 8 * ir_outer.GROUPS  # weight rows per pass of the outer product
assert ROWS_PER_TASK % _OUTER_ROWS == 0


@cached_njit(parallel=True, nogil=True)
def run_jobs(
    jobs: np.ndarray,
    A: np.ndarray,
    S: np.ndarray,
    N: np.ndarray,
    C: np.ndarray,
    nsteps: int,
    nchunks: int,
    out: np.ndarray,
) -> None:
    """Each job's product [T, rows] into its block of the flat buffer out, by tasks of
    ROWS_PER_TASK weight rows x ROWS_PER_BLOCK activation rows; jobs [n, JOB_COLUMNS] int64
    (the job columns above). A task of a job with outer-product kernels and at least
    ir_outer.OUTER_MIN_ROWS activation rows converts its weight rows once into a
    scratch, then multiplies them by its activation rows TILE at a time from there."""
    T = A.shape[0]
    n_t = (T + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK
    first = first_tasks(jobs[:, _ROWS], ROWS_PER_TASK)
    n_r = first[-1]
    for task in prange(n_r * n_t):
        tb, c = task // n_r, task % n_r
        j = job_of(first, c)
        job = jobs[j]
        r0 = (c - first[j]) * ROWS_PER_TASK
        r1 = min(job[_ROWS], r0 + ROWS_PER_TASK)
        r_even = r0 + (r1 - r0) // _KROWS * _KROWS
        o = out.ctypes.data + T * job[_FIRST_ROW] * 4
        t, t_end = tb * ROWS_PER_BLOCK, min(T, (tb + 1) * ROWS_PER_BLOCK)
        if job[_OUTER] != 0 and t_end - t >= ir_outer.OUTER_MIN_ROWS and (r1 - r0) % _OUTER_ROWS == 0:
            scratch = np.empty((r1 - r0) * nsteps * job[_SCRATCH], np.uint8)
            call_kernel(job[_CONVERT], Int8Args(
                W=job[_W], D=job[_D], M=job[_M], A=A.ctypes.data, S=S.ctypes.data, N=N.ctypes.data, C=C.ctypes.data,
                nsteps=nsteps, nchunks=nchunks, r0=r0, r1=r1, wstride=job[_WSTRIDE], dstride=job[_DSTRIDE], t0=t, t1=t,
                astride=A.strides[0], sstride=S.strides[0], nstride=N.strides[0], cstride=C.strides[0],
                out=scratch.ctypes.data, ostride=0))
            t_tiles = t + (t_end - t) // _KTILE * _KTILE
            call_kernel(job[_OUTER], Int8Args(
                W=scratch.ctypes.data, D=scratch.ctypes.data, M=job[_M], A=A.ctypes.data, S=S.ctypes.data,
                N=N.ctypes.data, C=C.ctypes.data, nsteps=nsteps, nchunks=nchunks, r0=r0, r1=r1,
                wstride=nsteps * job[_SCRATCH], dstride=0, t0=t, t1=t_tiles, astride=A.strides[0],
                sstride=S.strides[0], nstride=N.strides[0], cstride=C.strides[0], out=o, ostride=job[_ROWS]))
            t = t_tiles
        while t < t_end:  # tiles of 4 activation rows (3 rows too: ir_frame.entry), then of 2, then 1
            shape = 2 if t + _KTILE - 1 <= t_end else (1 if t + 2 <= t_end else 0)
            tile = min((1, 2, _KTILE)[shape], t_end - t)
            for k, a, b in ((2 * shape + 1, r0, r_even), (2 * shape, r_even, r1)):
                if a < b:
                    call_kernel(job[_KERNELS + k], Int8Args(
                        W=job[_W], D=job[_D], M=job[_M], A=A.ctypes.data, S=S.ctypes.data, N=N.ctypes.data,
                        C=C.ctypes.data, nsteps=nsteps, nchunks=nchunks, r0=a, r1=b, wstride=job[_WSTRIDE],
                        dstride=job[_DSTRIDE], t0=t, t1=t + tile, astride=A.strides[0], sstride=S.strides[0],
                        nstride=N.strides[0], cstride=C.strides[0], out=o, ostride=job[_ROWS]))
            t += tile


@functools.cache
def _kernels(kind: str, dps: int, half: bool) -> tuple[int, ...]:
    """Addresses of the kernels of one layout, in ir.SHAPES' order."""
    addr = ir.addresses()
    assert addr is not None  # only weights of a host that runs the int8 kernels get here
    return tuple(addr[(kind, dps, half, tile, rows)] for tile, rows in ir.SHAPES)


def _outer_kernels(kind: str) -> tuple[int, int, int]:
    """A layout's outer-product prefill kernels (u5's, k4's, u6's) and scratch bytes per row and step, else zeros."""
    outer = ir.outer_addresses(kind)
    return (0, 0, 0) if outer is None else (*outer, ir_outer.scratch_bytes_per_row_step(kind))


def job_row(w: Any, first_row: int) -> tuple[int, ...]:
    """The job row (the columns above) of w, a products.Int8Weight (which imports this module):
    its arrays' addresses and strides, its rows, where its product starts in the output, and
    its layout's kernels."""
    return (w.qs.ctypes.data, w.d.ctypes.data, w.m.ctypes.data, w.qs.strides[0], w.d.strides[0], w.qs.shape[0],
            first_row, *_kernels(w.kind, w.dps, w.half), *_outer_kernels(w.kind))
