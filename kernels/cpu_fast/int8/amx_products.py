"""The int8 products of rounds with many rows on AMX tiles: activations rounded for the tile
kernels, the parallel driver over (weight rows, activation rows) tasks, and the kernels'
compile. products.py calls `product` for a launch of at least MIN_ROWS activation rows (a whole tile)
whose matrices all have a tile layout (amx_layout.py); fewer rows keep the VNNI kernels.

The activations are the VNNI kernels' codes (rounded per 32 columns, per 256 for the
K-quants, by the same rule: activations._block_scale), laid out plainly: A [T_pad, cols]
int8, S [T_pad, cols / group] f32 = d_a of each rounding group, N [T_pad, cols / 32] f32 per
32-block: f32(d_a * f32(code sum)) (u4's offsets' factor N_b; group 32 only), and for group
256 CS [T_pad, cols / 256, 2, 64] int8: each super-block's 8 exact code sums split 64 ch + cl
(8 ch and 56 zeros, then 8 cl and 56 zeros: k4's Msum, amx_ir_folded.py); T_pad = T rounded
up to 32, the pad rows zero (the kernels read whole tiles). The kernels (amx_ir.py,
amx_ir_folded.py) apply them in the one int8 float order (tests/int8_canonical.py), so a
row's result is the VNNI kernels' bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from zinfer.kernels.cpu_fast import code_cache, llvm_host
from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_ir, amx_ir_folded
from zinfer.kernels.cpu_fast.int8.activations import _block_scale
from zinfer.kernels.cpu_fast.int8.amx_ir import AmxArgs
from zinfer.kernels.cpu_fast.int8.tasks import first_tasks, job_of
from zinfer.kernels.cpu_fast.int8.amx_layout import ROW_MULTIPLE, AmxWeight, aligned_empty
from zinfer.kernels.cpu_fast.kernel_signature import call_kernel
from zinfer.kernels.cpu_fast.numba_types import Int

# activation rows of a launch from which the tiles beat the VNNI kernels (BENCHMARKS.md: measured per row count)
MIN_ROWS = 16
ROWS_PER_TASK = 32  # weight rows per parallel task (one kernel step)
# activation bytes (rows x cols) a task keeps in L2 across its weight rows: a task multiplies
# every activation row it can hold by its weight rows, so that each weight byte comes from
# memory once per launch, not once per 128 activation rows
TASK_ACT_BYTES = 1 << 20
PAD_ROWS = 32  # the kernels' step of activation rows
# columns of a job row: the weights' tiles (k4, u6: hi, lo), scales, offsets, mins' tiles,
# tile products per row, rows, where its product starts in `out` (at T * first_row floats,
# a C-contiguous [T, rows] block), its kernel
_B, _L, _D, _M, _MN, _NBLOCKS, _ROWS, _FIRST_ROW, _KERNEL = range(9)
JOB_COLUMNS = 9
KINDS = amx_ir.KINDS + amx_ir_folded.KINDS  # amx_layout's kinds: a kernel each


def module_ir() -> str:
    """IR of the module of every AMX product kernel (KINDS), with the intrinsics' declarations."""
    kernels = [amx_ir.kernel_ir(k) for k in amx_ir.KINDS] + [amx_ir_folded.kernel_ir(k) for k in amx_ir_folded.KINDS]
    return amx_ir.DECLS + "\n".join(kernels)


@functools.cache
def addresses() -> dict[str, int] | None:
    """The machine-code address of each kernel of KINDS, kind -> address; None where this
    process may not run AMX tiles (amx_host) or llvmlite cannot compile them."""
    if not amx_host.tiles_permitted():
        return None
    try:
        names = [amx_ir.kernel_name(kind) for kind in KINDS]
        addr = llvm_host.compile_for_host(module_ir(), names, cache_dir=code_cache.llvm_dir())
    except (RuntimeError, OSError):
        return None
    return {kind: addr[amx_ir.kernel_name(kind)] for kind in KINDS}


def job_table(ws: list[AmxWeight], first_rows: list[int]) -> np.ndarray | None:
    """The AMX jobs [n, JOB_COLUMNS] int64 of matrices whose activations round alike (one
    AmxWeight.group), each at its first row of the stacked output, or None when the tiles do
    not run here."""
    addr = addresses()
    if addr is None or len({w.group for w in ws}) != 1:
        return None
    return np.array([
        (w.codes.ctypes.data, w.lo.ctypes.data, w.d.ctypes.data, w.m.ctypes.data, w.mn.ctypes.data, w.nblocks,
         w.codes.shape[0] * 16, row, addr[w.kind])
        for w, row in zip(ws, first_rows)
    ], np.int64)


def activations_for(T: int, K: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Uninitialised (A, S, N, CS) for T rows of K columns rounded per `group` (the module
    docstring's shapes), each 64-byte aligned: A's and CS's rows are tile rows."""
    padded = padded_rows(T)
    return (aligned_empty((padded, K), np.int8), aligned_empty((padded, K // group), np.float32),
            aligned_empty((padded, K // 32), np.float32), aligned_empty((padded, max(K // 256, 1), 2, 64), np.int8))


@cached_njit(nogil=True, inline="always")
def padded_rows(T: Int) -> int:
    """T rounded up to the kernels' step of activation rows (the rows of A, S, N, CS)."""
    return (T + PAD_ROWS - 1) // PAD_ROWS * PAD_ROWS


@cached_njit(parallel=True, nogil=True, fastmath={"reassoc", "nsz", "nnan", "ninf"})
def _quantize(x: np.ndarray, group: Int, A: np.ndarray, S: np.ndarray, N: np.ndarray, CS: np.ndarray) -> None:
    """A, S, N, CS (activations_for) = x [T, cols] f32 rounded per `group` columns (32 or 256),
    the module docstring's activations; the pad rows zero."""
    T = x.shape[0]
    A[T:] = 0
    S[T:] = 0
    N[T:] = 0  # (group 256: N unread)
    CS[T:] = 0  # (group 32: CS unread)
    for t in prange(T):
        if group == 32:  # a constant group in each inlined copy: its loops vectorize (1.5x faster)
            _quantize_row(x[t], 32, A[t], S[t], N[t], CS[t])
        else:
            CS[t] = 0  # the zeros beside each super-block's 8 sums
            _quantize_row(x[t], 256, A[t], S[t], N[t], CS[t])


@cached_njit(nogil=True, inline="always", fastmath={"reassoc", "nsz", "nnan", "ninf"})
def _quantize_row(xt: np.ndarray, group: Int, At: np.ndarray, St: np.ndarray, Nt: np.ndarray,
                  CSt: np.ndarray) -> None:
    """One row of _quantize: xt [cols] f32 into At [cols] int8, St, and Nt (group 32) or CSt (256)."""
    for g in range(xt.shape[0] // group):
        base = g * group
        d, inv = _block_scale(xt, base, group)
        St[g] = d
        for b in range(base // 32, base // 32 + group // 32):
            total = np.float32(0)  # exact: at most 32 * 127
            for i in range(32):
                c = np.rint(xt[b * 32 + i] * inv)
                At[b * 32 + i] = np.int8(c)
                total += c
            if group == 32:
                Nt[b] = d * total
            else:  # total = 64 ch + cl, cl in 0..63
                whole = np.int64(total)
                CSt[b // 8, 0, b % 8] = np.int8(whole >> 6)
                CSt[b // 8, 1, b % 8] = np.int8(whole & 63)


@cached_njit(nogil=True, inline="always")
def act_rows_per_task(T: Int, cols: Int) -> int:
    """Activation rows of a task: TASK_ACT_BYTES of them in whole tile steps, at least one step."""
    fit = max(TASK_ACT_BYTES // cols // PAD_ROWS, 1) * PAD_ROWS
    return min(fit, (T + PAD_ROWS - 1) // PAD_ROWS * PAD_ROWS)


@cached_njit(parallel=True, nogil=True)
def _run(
    jobs: np.ndarray, A: np.ndarray, S: np.ndarray, N: np.ndarray, CS: np.ndarray, T: Int, out: np.ndarray
) -> None:
    """Each job's product [T, rows] into its block of the flat buffer out, by tasks of
    ROWS_PER_TASK weight rows x act_rows activation rows (act_rows_per_task)."""
    act_rows = act_rows_per_task(T, A.shape[1])
    n_t = (T + act_rows - 1) // act_rows
    first = first_tasks(jobs[:, _ROWS], ROWS_PER_TASK)
    n_r = first[-1]
    for task in prange(n_r * n_t):
        tb, c = task // n_r, task % n_r
        j = job_of(first, c)
        job = jobs[j]
        r0 = (c - first[j]) * ROWS_PER_TASK
        t0 = tb * act_rows
        call_kernel(job[_KERNEL], AmxArgs(
            B=job[_B], L=job[_L], D=job[_D], M=job[_M], MN=job[_MN], A=A.ctypes.data, S=S.ctypes.data,
            N=N.ctypes.data, CS=CS.ctypes.data, nblocks=job[_NBLOCKS], r0=r0, r1=r0 + ROWS_PER_TASK, t0=t0,
            t1=min(T, t0 + act_rows), astride=A.strides[0], sstride=S.strides[0], nstride=N.strides[0],
            csstride=CS.strides[0], out=out.ctypes.data + T * job[_FIRST_ROW] * 4, ostride=job[_ROWS]))


def product(jobs: np.ndarray, x: np.ndarray, group: int, out: np.ndarray) -> None:
    """out (flat f32, each job's [T, rows] at T * its first row) = x [T, cols] f32 times
    each job's matrix, x rounded per `group` columns (32 or 256: the jobs' AmxWeight.group)."""
    assert ROWS_PER_TASK == ROW_MULTIPLE
    product_in(jobs, x, group, *activations_for(x.shape[0], x.shape[1], group), out)


@cached_njit(nogil=True)
def product_in(
    jobs: np.ndarray, x: np.ndarray, group: Int, A: np.ndarray, S: np.ndarray, N: np.ndarray, CS: np.ndarray,
    out: np.ndarray,
) -> None:
    """product, with x rounded into the scratch A, S, N, CS (activations_for(T, cols, group)):
    a recorded round's (kernels/cpu_fast/cpu_tape.py) allocates them once."""
    _quantize(x, group, A, S, N, CS)
    _run(jobs, A, S, N, CS, x.shape[0], out)
