"""Quantized matrix products on the CPU in numba: GGUF blocks kept as blocks.

At upload every supported type is repacked, exactly, into one of two layouts that the
kernels read (the values are bit-identical to oracle.quants.dequantize):

- U4 (Q4_0, Q4_1, Q4_K): 4-bit codes with an f32 scale and offset per 32 values,
  value = code * d + m. Byte i of a 32-block holds code i (low nibble) and code i+16.
- I8 (Q8_0, Q5_0, Q6_K): int8 codes with an f32 scale per group of 32 (or 16 for
  Q6_K), value = code * d.

Products convert each block to f32 inside the kernel and multiply against f32
activations with 32-lane accumulators (no per-block horizontal sums): on this CPU that
beat llama.cpp's int8-activation recipe in numba. Large batches instead dequantize
the matrix to f32 (`dequantize_*`) and call BLAS; the caller picks (devices/cpu_fast).
All kernels are cached (code_cache.cached_njit): the first process pays the compile,
later ones load it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import prange

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.numba_types import Int
from zinfer.kernels.oracle.block_fields import f16, k4_scales_mins, nibbles, q5_codes

U4_TYPES = (QT.Q4_0, QT.Q4_1, QT.Q4_K)
I8_TYPES = (QT.Q8_0, QT.Q5_0, QT.Q6_K)
_ROWS_PER_TASK = 16  # rows of the weight one parallel task computes


class Packed(NamedTuple):
    """A repacked quantized matrix [rows, cols]: kind 'u4' or 'i8'."""

    kind: str
    qs: np.ndarray  # u4: [rows, cols/2] uint8; i8: [rows, cols] int8
    d: np.ndarray  # [rows, cols/group] float32 scales
    m: np.ndarray  # u4: [rows, cols/32] float32 offsets; i8: [rows, 0]
    group: int  # values per scale: 32, or 16 (Q6_K)

    @property
    def shape(self) -> tuple[int, int]:
        rows = self.qs.shape[0]
        return rows, self.qs.shape[1] * (2 if self.kind == "u4" else 1)

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.d.nbytes + self.m.nbytes


# ---- repacking (numpy, once at upload) ----


def _pack_u4(codes: np.ndarray) -> np.ndarray:
    """codes [rows, n_blocks, 32] in 0..15 -> [rows, n_blocks*16] uint8 (i | i+16 << 4)."""
    packed: np.ndarray = (codes[..., :16] | (codes[..., 16:] << 4)).reshape(codes.shape[0], -1)
    return packed


def repack(qtype: QT | int, raw: np.ndarray, shape: tuple[int, int]) -> Packed:
    """Raw GGUF bytes of a [rows, cols] matrix of a supported type -> Packed."""
    qt = QT(qtype)
    rows, cols = shape
    b: np.ndarray = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if qt in (QT.Q4_0, QT.Q4_1):
        bpb = 18 if qt == QT.Q4_0 else 20
        b = b.reshape(rows * cols // 32, bpb)
        d = f16(b[:, 0:2])[:, 0]
        m = -8 * d if qt == QT.Q4_0 else f16(b[:, 2:4])[:, 0]
        codes = nibbles(b[:, bpb - 16 :]).reshape(rows, cols // 32, 32)
        return Packed("u4", _pack_u4(codes), d.reshape(rows, -1), m.reshape(rows, -1), 32)
    if qt == QT.Q4_K:
        b = b.reshape(rows * cols // 256, 144)
        n = b.shape[0]
        sc, mn = k4_scales_mins(b[:, 4:16])
        d = (f16(b[:, 0:2]) * sc).astype(np.float32)  # [n, 8]
        m = -(f16(b[:, 2:4]) * mn).astype(np.float32)
        codes = nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(rows, cols // 32, 32)
        return Packed("u4", _pack_u4(codes), d.reshape(rows, -1), m.reshape(rows, -1), 32)
    if qt == QT.Q8_0:
        b = b.reshape(rows * cols // 32, 34)
        qs = np.ascontiguousarray(b[:, 2:]).view(np.int8).reshape(rows, cols)
        return Packed("i8", qs, f16(b[:, 0:2]).reshape(rows, -1), np.zeros((rows, 0), np.float32), 32)
    if qt == QT.Q5_0:
        b = b.reshape(rows * cols // 32, 22)
        q = q5_codes(b[:, 2:6], b[:, 6:22])
        q -= 16
        no_m = np.zeros((rows, 0), np.float32)
        return Packed("i8", q.view(np.int8).reshape(rows, cols), f16(b[:, 0:2]).reshape(rows, -1), no_m, 32)
    if qt == QT.Q6_K:
        b = b.reshape(rows * cols // 256, 210)
        n = b.shape[0]
        q = nibbles(b[:, 0:128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)
        high = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        q |= (high & 3) << 4
        q -= 32
        d = (f16(b[:, 208:210]) * b[:, 192:208].view(np.int8)).astype(np.float32)  # [n, 16]
        no_m = np.zeros((rows, 0), np.float32)
        return Packed("i8", q.view(np.int8).reshape(rows, cols), d.reshape(rows, -1), no_m, 16)
    raise ValueError(f"no packed layout for {qt.name}")


# ---- small-batch products: out [T, rows] = x [T, cols] @ W.T ----


@cached_njit(parallel=True, fastmath=True, nogil=True)
def matmul_u4(qs: np.ndarray, d: np.ndarray, m: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[t, r] = sum_k W[r, k] x[t, k] for a U4 matrix. x [T, K] f32, out [T, R] f32."""
    R = qs.shape[0]
    T, K = x.shape
    nb = K // 32
    n_tasks = (R + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for c in prange(n_tasks):
        acc = np.empty((T, 32), np.float32)
        for r in range(c * _ROWS_PER_TASK, min(R, (c + 1) * _ROWS_PER_TASK)):
            qr, dr, mr = qs[r], d[r], m[r]
            acc[:] = 0.0
            for b in range(nb):
                db, mb, o = dr[b], mr[b], b * 32
                qb = qr[b * 16 : b * 16 + 16]
                for t in range(T):
                    xt, at = x[t], acc[t]
                    for i in range(16):
                        q = qb[i]
                        at[i] += (np.float32(q & 15) * db + mb) * xt[o + i]
                        at[16 + i] += (np.float32(q >> 4) * db + mb) * xt[o + 16 + i]
            for t in range(T):
                out[t, r] = np.sum(acc[t])


@cached_njit(parallel=True, fastmath=True, nogil=True)
def matmul_i8(qs: np.ndarray, d: np.ndarray, group: Int, x: np.ndarray, out: np.ndarray) -> None:
    """out[t, r] = sum_k W[r, k] x[t, k] for an I8 matrix (scale per `group` values)."""
    R = qs.shape[0]
    T, K = x.shape
    ng = K // group
    n_tasks = (R + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for c in prange(n_tasks):
        acc = np.empty((T, 32), np.float32)
        w = np.empty(32, np.float32)
        for r in range(c * _ROWS_PER_TASK, min(R, (c + 1) * _ROWS_PER_TASK)):
            qr, dr = qs[r], d[r]
            acc[:] = 0.0
            for g in range(ng):
                db, o = dr[g], g * group
                for i in range(group):
                    w[i] = np.float32(qr[o + i]) * db
                for t in range(T):
                    xt, at = x[t], acc[t]
                    for i in range(group):
                        at[i] += w[i] * xt[o + i]
            for t in range(T):
                out[t, r] = np.sum(acc[t])


# ---- one row (decode at batch 1): accumulators the compiler keeps in registers ----


@cached_njit(parallel=True, fastmath=True, nogil=True)
def matvec_u4(qs: np.ndarray, d: np.ndarray, m: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[r] = sum_k W[r, k] x[k] for a U4 matrix. x [K] f32, out [R] f32."""
    R = qs.shape[0]
    nb = x.shape[0] // 32
    n_tasks = (R + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for c in prange(n_tasks):
        for r in range(c * _ROWS_PER_TASK, min(R, (c + 1) * _ROWS_PER_TASK)):
            qr, dr, mr = qs[r], d[r], m[r]
            lo = np.zeros(16, np.float32)
            hi = np.zeros(16, np.float32)
            for b in range(nb):
                db, mb, o = dr[b], mr[b], b * 32
                for i in range(16):
                    q = qr[b * 16 + i]
                    lo[i] += (np.float32(q & 15) * db + mb) * x[o + i]
                    hi[i] += (np.float32(q >> 4) * db + mb) * x[o + 16 + i]
            s = np.float32(0)
            for i in range(16):
                s += lo[i] + hi[i]
            out[r] = s


# ---- dequantization to f32 (for BLAS products and embedding rows) ----


@cached_njit(parallel=True, fastmath=True, nogil=True)
def dequantize_u4(qs: np.ndarray, d: np.ndarray, m: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[i] = f32 row rows[i] of a U4 matrix. rows [n] int64, out [n, K]."""
    nb = d.shape[1]
    for j in prange(rows.shape[0]):
        r = rows[j]
        qr, dr, mr, o_ = qs[r], d[r], m[r], out[j]
        for b in range(nb):
            db, mb, o = dr[b], mr[b], b * 32
            for i in range(16):
                q = qr[b * 16 + i]
                o_[o + i] = np.float32(q & 15) * db + mb
                o_[o + 16 + i] = np.float32(q >> 4) * db + mb


@cached_njit(parallel=True, fastmath=True, nogil=True)
def dequantize_i8(qs: np.ndarray, d: np.ndarray, group: Int, rows: np.ndarray, out: np.ndarray) -> None:
    """out[i] = f32 row rows[i] of an I8 matrix. rows [n] int64, out [n, K]."""
    ng = d.shape[1]
    for j in prange(rows.shape[0]):
        r = rows[j]
        qr, dr, o_ = qs[r], d[r], out[j]
        for g in range(ng):
            db, o = dr[g], g * group
            for i in range(group):
                o_[o + i] = np.float32(qr[o + i]) * db


def matmul(p: Packed, x: np.ndarray, out: np.ndarray) -> None:
    """out [T, rows] = x [T, cols] @ W.T with the small-batch kernel of p's layout."""
    if p.kind == "u4" and x.shape[0] == 1:  # faster than matmul_u4 at one row (BENCHMARKS.md)
        matvec_u4(p.qs, p.d, p.m, x[0], out[0])
    elif p.kind == "u4":
        matmul_u4(p.qs, p.d, p.m, x, out)
    else:
        matmul_i8(p.qs, p.d, p.group, x, out)


def dequantize_rows(p: Packed, rows: np.ndarray, out: np.ndarray) -> None:
    """out [n, cols] = the f32 values of rows [n] of p."""
    if p.kind == "u4":
        dequantize_u4(p.qs, p.d, p.m, rows, out)
    else:
        dequantize_i8(p.qs, p.d, p.group, rows, out)
