"""Quantized products with int8 activations on VNNI (kernels/int8_ir.py), driven by numba.

llama.cpp's recipe: round each 32-block of activations to int8 with a float scale
(d = amax / 127), multiply by the integer weight codes exactly, apply the scales in
float. Our scales stay f32 (llama.cpp rounds them to fp16), so the rounding is never
coarser than llama.cpp's. `prepare` adds what the kernels need to a packed matrix of
kernels/cpu_quant.py, `matmul` computes out [T, rows] = x [T, cols] @ W.T.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from zinfer.kernels import int8_ir
from zinfer.kernels.cpu_quant import Packed

ROWS_PER_TASK = 16  # weight rows per parallel task
ROWS_PER_BLOCK = 64  # activation rows per parallel task
_NARGS = len(int8_ir.ARGS)


class Int8Weight(NamedTuple):
    """A packed matrix as the int8 kernels read it."""

    kind: str  # "u4" or "i8"
    dps: int  # d/m floats per 8-lane step
    qs: np.ndarray  # [rows, cols/2] uint8 (u4) or [rows, cols] int8
    d: np.ndarray  # [rows, groups] float32 scales
    m: np.ndarray  # [rows, groups] float32: u4 offsets; i8: -128 * d * sum(codes of the group)
    nsteps: int  # 8-lane steps per row


def prepare(p: Packed) -> Int8Weight | None:
    """The int8-kernel view of p, or None when its shape or layout has no kernel."""
    rows, cols = p.shape
    if p.kind == "u4" and cols % 64 == 0:
        return Int8Weight("u4", 2, p.qs, p.d, p.m, cols // 64)
    if p.kind == "i8" and cols % 32 == 0 and p.group in (16, 32):
        sums = p.qs.reshape(rows, cols // p.group, p.group).sum(-1, dtype=np.int32)
        m = (np.float32(-128.0) * p.d * sums.astype(np.float32)).astype(np.float32)
        return Int8Weight("i8", 32 // p.group, p.qs, p.d, m, cols // 32)
    return None


# ---- activations: [T, cols] f32 -> int8 codes A and per-lane scales S, N [T, steps * 8] ----


@njit(cache=True, nogil=True)
def _block_scale(xb):
    """A block's int8 scale d = amax / 127 and its inverse 127 / amax (0 for a zero block)."""
    amax = np.float32(0)
    for v in xb:
        amax = max(amax, abs(v))
    return amax / np.float32(127), (np.float32(127) / amax if amax > 0 else np.float32(0))


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def quantize_for_u4(x, A, S, N):
    """A [T, cols] int8 in the u4 step order; S lanes = d_a, N lanes = d_a * sum(codes) / 4."""
    T, K = x.shape
    q = np.empty((T, 32), np.int8)
    for t in prange(T):
        qt = q[t]
        for b in range(K // 32):
            d, inv = _block_scale(x[t, b * 32 : b * 32 + 32])
            total = 0
            for i in range(32):
                c = int(np.rint(x[t, b * 32 + i] * inv))
                qt[i] = c
                total += c
            s, half = b // 2, b % 2  # step and which of its two blocks
            base = s * 64 + half * 16
            for i in range(16):
                A[t, base + i] = qt[i]
                A[t, base + 32 + i] = qt[16 + i]
            for lane in range(4):
                S[t, s * 8 + half * 4 + lane] = d
                N[t, s * 8 + half * 4 + lane] = d * np.float32(total) * np.float32(0.25)


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def quantize_for_i8(x, A, S, N, share):
    """A [T, cols] uint8 = code + 128; S lanes = d_a, N lanes = d_a * share, the part of
    a step's m_w each lane carries: 1/8 (one m_w per step) or 1/4 (two, per 4 lanes)."""
    T, K = x.shape
    for t in prange(T):
        for b in range(K // 32):
            d, inv = _block_scale(x[t, b * 32 : b * 32 + 32])
            for i in range(32):
                A[t, b * 32 + i] = np.uint8(int(np.rint(x[t, b * 32 + i] * inv)) + 128)
            for lane in range(8):
                S[t, b * 8 + lane] = d
                N[t, b * 8 + lane] = d * share


# ---- the parallel driver ----


@intrinsic
def _call(typingctx, address, args):
    """Call the machine code at `address` with 16 int64 arguments."""
    sig = types.void(types.int64, types.UniTuple(types.int64, _NARGS))

    def codegen(context, builder, signature, llargs):
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] * _NARGS)
        fn = builder.inttoptr(llargs[0], fnty.as_pointer())
        builder.call(fn, [builder.extract_value(llargs[1], i) for i in range(_NARGS)])
        return context.get_dummy_value()

    return sig, codegen


@njit(parallel=True, cache=True, nogil=True)
def _run(wide, one, tile, W, D, M, A, S, N, nsteps, out):
    """out [T, R] by tasks of ROWS_PER_TASK weight rows x ROWS_PER_BLOCK activation rows."""
    R = W.shape[0]
    T = A.shape[0]
    n_r = (R + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    n_t = (T + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK
    for task in prange(n_r * n_t):
        tb, c = task // n_r, task % n_r
        r0, r1 = c * ROWS_PER_TASK, min(R, (c + 1) * ROWS_PER_TASK)
        t, t_end = tb * ROWS_PER_BLOCK, min(T, (tb + 1) * ROWS_PER_BLOCK)
        while t < t_end:
            fn, step = (wide, tile) if t + tile <= t_end else (one, 1)
            _call(fn, (W.ctypes.data, D.ctypes.data, M.ctypes.data, A.ctypes.data, S.ctypes.data, N.ctypes.data,
                       nsteps, r0, r1, W.strides[0], D.strides[0], t, A.strides[0], S.strides[0],
                       out.ctypes.data, out.strides[0] // 4))
            t += step


def rounded(x: np.ndarray) -> np.ndarray:
    """x [T, cols] f32 as the int8 kernels see it: per 32 values, codes rint(x * 127 / amax)
    times amax / 127 (numpy, the reference for tests)."""
    T, cols = x.shape
    xb = x.reshape(T, cols // 32, 32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return (np.rint(xb * inv) * (amax / np.float32(127))).astype(np.float32).reshape(T, cols)


def quantize_activations(w: Int8Weight, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [T, cols] f32 rounded for w's kernel: (A [T, cols], S, N [T, steps * 8])."""
    T, cols = x.shape
    lanes = w.nsteps * 8
    S = np.empty((T, lanes), np.float32)
    N = np.empty((T, lanes), np.float32)
    if w.kind == "u4":
        A = np.empty((T, cols), np.int8)
        quantize_for_u4(x, A, S, N)
    else:
        A = np.empty((T, cols), np.uint8)
        quantize_for_i8(x, A, S, N, np.float32(w.dps / 8))
    return A, S, N


def matmul(w: Int8Weight, x: np.ndarray, out: np.ndarray, acts: tuple | None = None) -> None:
    """out [T, rows] = x [T, cols] @ W.T. `acts`: quantize_activations(w, x), when the
    caller shares one rounding of x between matrices of the same kind."""
    A, S, N = acts if acts is not None else quantize_activations(w, x)
    addr = int8_ir.addresses()
    wide, one = addr[(w.kind, w.dps, int8_ir.TILE)], addr[(w.kind, w.dps, 1)]
    _run(wide, one, int8_ir.TILE, w.qs, w.d, w.m, A, S, N, w.nsteps, out)
