"""cpu-fast's int8 activations: x [T, cols] f32 rounded to int8 codes A in the order a
weight layout's kernels read them (the orders of products.py's table), with per-lane scales
S [T, steps * 8], u4's and k4's offset sums N (d_a times each 32-block's code sum), u5's
and u6's code offsets C (what their unsigned codes' offset takes off, once per activation
row, not once per weight-row pass) and k4's code sums C (each 32-block's, as integers).
Every function has a parallel copy and one for one thread (cpu_ops.compile_twice).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.numba_types import Int
from zinfer.kernels.cpu_fast.cpu_ops import (
    ABS_BITS,
    NON_FINITE_BITS,
    _f32_from_bits,
    compile_twice,
    f32_bits,
    specialize,
)

PLAIN, U4_ORDER, U6_ORDER, K4_ORDER, U5_ORDER = ORDERS = 0, 1, 2, 3, 4  # the orders of activations in a step
ORDER_NAMES = ("plain", "u4", "u6", "k4", "u5")
_ORDER = PLAIN  # the order of a _quantize_in copy: each binds its own (cpu_ops.specialize)


@cached_njit(nogil=True, error_model="numpy", inline="always")
def _block_scale(xt: np.ndarray, start: Int, size: Int) -> tuple[np.float32, np.float32]:
    """The int8 scale d = amax / 127 and its inverse 127 / amax (0 for a zero block) of the
    block xt[start : start + size] (indexed, not sliced: a slice's loop did not vectorize).

    A block holding a NaN or an infinity gets d = NaN (and inv 0): every product it enters
    is NaN, so the sampler's finite check fails the request instead of sampling plausible
    tokens from codes that rounded the NaN to a number. amax is taken on the bits (|v|'s
    bits order as |v| does, inf and NaN above every finite value): the callers' fast-math
    flags fold a float NaN test away (v != v was), never an integer one."""
    top = np.int32(0)
    for i in range(start, start + size):  # int32 selects: vectorized (max() of numba's int64 was not)
        magnitude = np.int32(f32_bits(xt[i]) & ABS_BITS)
        top = top if top >= magnitude else magnitude
    if top >= NON_FINITE_BITS:
        return np.float32(np.nan), np.float32(0)
    amax = _f32_from_bits(top)
    return amax / np.float32(127), (np.float32(127) / amax if amax > 0 else np.float32(0))


def _quantize_for_u4(x: np.ndarray, A: np.ndarray, S: np.ndarray, N: np.ndarray, group: Int) -> None:
    """A [T, cols] int8 in the u4 step order, rounded per `group` columns (32 or 256); S
    lanes = d_a; N [T, chunks * 8] = d_a * sum(codes) per 32-block, zero-padded."""
    T, K = x.shape
    for t in prange(T):
        xt, At = x[t], A[t]
        for g in range(K // group):
            d, inv = _block_scale(xt, g * group, group)
            for b in range(g * group // 32, (g + 1) * group // 32):
                xb = xt[b * 32 : b * 32 + 32]
                s, half = b // 2, b % 2  # step and which of its two blocks
                lo = At[s * 64 + half * 16 : s * 64 + half * 16 + 16]  # the block's codes 0..15
                hi = At[s * 64 + 32 + half * 16 : s * 64 + 32 + half * 16 + 16]  # and 16..31
                total = np.float32(0)  # exact: at most 32 * 127
                for i in range(16):  # straight-line over slices: LLVM vectorizes it
                    c0 = np.rint(xb[i] * inv)
                    c1 = np.rint(xb[16 + i] * inv)
                    lo[i] = np.int8(c0)
                    hi[i] = np.int8(c1)
                    total += c0 + c1
                S[t, s * 8 + half * 4 : s * 8 + half * 4 + 4] = d
                N[t, b] = d * total
        N[t, K // 32 :] = 0


def _quantize_for_k4(x: np.ndarray, A: np.ndarray, S: np.ndarray, N: np.ndarray, C: np.ndarray, group: Int) -> None:
    """A [T, cols] int8 in the k4 order (layouts.K4_COLUMNS: per 256 columns,
    byte 64 * j + 32 * h + 4 * b + r holds column 32 * b + 8 * j + 4 * h + r), rounded per
    `group` (256) columns; S lanes = d_a; N [T, chunks * 8] = d_a * sum(codes) per 32-block;
    C[t, 8g + b] = that sum as an integer (block b of super-block g: the mins' factor)."""
    T, K = x.shape
    for t in prange(T):
        xt, At = x[t], A[t]
        for g in range(K // group):
            d, inv = _block_scale(xt, g * group, group)
            for b in range(8):
                at = g * 256 + 4 * b
                xb = xt[g * 256 + 32 * b : g * 256 + 32 * b + 32]
                total = np.float32(0)  # exact: at most 32 * 127
                for j in range(4):
                    for h in range(2):
                        for r in range(4):
                            c = np.rint(xb[8 * j + 4 * h + r] * inv)
                            At[at + 64 * j + 32 * h + r] = np.int8(c)
                            total += c
                N[t, g * 8 + b] = d * total
                C[t, g * 8 + b] = np.int32(total)
            S[t, g * 32 : g * 32 + 32] = d
        N[t, K // 32 :] = 0


def _quantize_for_u5(x: np.ndarray, A: np.ndarray, S: np.ndarray, C: np.ndarray) -> None:
    """A [T, cols] int8 in the u5 order (layouts.U5_COLUMNS: per 128 columns,
    byte 32v + k holds column 32 * (k // 8) + 8v + k % 8), rounded per 32 columns; per
    group g of 128, S[t, 16g + l] = d_a of block l // 2 and C[t, 16g + l] = -16 times the
    lane's 16 activations (bytes 4l..4l + 3 of the 4 vectors), for l < 8."""
    T, K = x.shape
    for t in prange(T):
        xt, At = x[t], A[t]
        for b in range(K // 32):
            d, inv = _block_scale(xt, b * 32, 32)
            g, within = b // 4, b % 4
            at = g * 128 + 8 * within
            for v in range(4):
                for r in range(8):
                    At[at + 32 * v + r] = np.int8(np.rint(xt[b * 32 + 8 * v + r] * inv))
            for half in range(2):
                lane = g * 16 + 2 * within + half
                S[t, lane] = d
                total = np.int32(0)
                for v in range(4):
                    for r in range(4):
                        total += np.int32(At[at + 32 * v + 4 * half + r])
                C[t, lane] = -16 * total


def _quantize_for_u6(x: np.ndarray, A: np.ndarray, S: np.ndarray, group: Int) -> None:
    """A [T, cols] int8 in the u6 step order (per 64 columns: columns 0..7 of each of its
    four 16-groups, then their 8..15; layouts.U6_LOW and U6_HIGH), rounded per
    `group` columns (256); S lanes = d_a (8 per step)."""
    T, K = x.shape
    for t in prange(T):
        xt, At = x[t], A[t]
        for gr in range(K // group):
            d, inv = _block_scale(xt, gr * group, group)
            for g in range(gr * group // 16, (gr + 1) * group // 16):
                xg = xt[g * 16 : g * 16 + 16]
                at = (g // 4) * 64 + (g % 4) * 8  # the group's 8 bytes of its step's low vector
                lo, hi = At[at : at + 8], At[at + 32 : at + 40]
                for i in range(8):  # straight-line over slices: LLVM vectorizes it
                    lo[i] = np.int8(np.rint(xg[i] * inv))
                    hi[i] = np.int8(np.rint(xg[8 + i] * inv))
            S[t, gr * group // 8 : (gr + 1) * group // 8] = d


def _quantize_for_i8(x: np.ndarray, A: np.ndarray, S: np.ndarray, group: Int) -> None:
    """A [T, cols] int8 codes, rounded per `group` columns (32 or 256); S lanes = d_a (8 per 32 columns)."""
    T, K = x.shape
    for t in prange(T):
        xt, At = x[t], A[t]
        for g in range(K // group):
            d, inv = _block_scale(xt, g * group, group)
            for i in range(g * group, g * group + group):
                At[i] = np.int8(np.rint(xt[i] * inv))
            S[t, g * group // 4 : (g * group + group) // 4] = d


def _u6_offsets_for(A: np.ndarray, C: np.ndarray) -> None:
    """C [T, steps * 8] int32 viewed as int16 [T, steps * 16] = what u6's kernel takes off
    for its unsigned codes (0..63, the file's plus 32), per activation row and step, from A
    [T, steps * 64] int8 in the u6 order (the low vector at byte 0 of a step, the high at
    32): lane k = 32 * their bytes 2k, 2k + 1 (the pair sums vpmaddubsw gives by 32). Once
    per activation row, where the kernel computed them once per weight-row pass."""
    T = A.shape[0]
    steps = A.shape[1] // 64
    C16 = C.view(np.int16)
    for t in prange(T):
        for s in range(steps):
            lo, hi = A[t, s * 64 : s * 64 + 32], A[t, s * 64 + 32 : s * 64 + 64]
            for k in range(16):
                C16[t, s * 16 + k] = np.int16(32 * (np.int32(lo[2 * k]) + lo[2 * k + 1] + hi[2 * k] + hi[2 * k + 1]))


# reductions (amax, code sums) may be reordered and vectorized; no approximate division,
# so the codes and scales stay those of rounded() bit for bit
_REDUCE = {"reassoc", "nsz", "nnan", "ninf"}
_quantize_u4, _quantize_u4_one = compile_twice(_quantize_for_u4, fastmath=_REDUCE)
_quantize_i8, _quantize_i8_one = compile_twice(_quantize_for_i8, fastmath=_REDUCE)
_quantize_u6, _quantize_u6_one = compile_twice(_quantize_for_u6, fastmath=_REDUCE)
_quantize_k4, _quantize_k4_one = compile_twice(_quantize_for_k4, fastmath=_REDUCE)
_quantize_u5, _quantize_u5_one = compile_twice(_quantize_for_u5, fastmath=_REDUCE)
_u6_offsets, _u6_offsets_one = compile_twice(_u6_offsets_for)


def _quantize_in(
    x: np.ndarray, group: Int, nsteps: Int, nchunks: Int, one: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x [T, cols] f32 rounded per `group` columns in the activation order _ORDER (each
    copy's own constant, cpu_ops.specialize) -> (A [T, cols] int8, S [T, nsteps * 8] f32,
    N [T, nchunks * 8] f32 (u4's and k4's orders, else [T, 1]), C [T, nsteps * 8] int32
    (u5's, u6's and k4's orders, else [T, 1])); `one`: on this thread alone."""
    T, cols = x.shape
    A = np.empty((T, cols), np.int8)
    S = np.empty((T, nsteps * 8), np.float32)  # d_a per lane
    N = np.empty((T, nchunks * 8 if _ORDER == U4_ORDER or _ORDER == K4_ORDER else 1), np.float32)
    C = np.empty((T, nsteps * 8 if _ORDER == U5_ORDER or _ORDER == U6_ORDER or _ORDER == K4_ORDER else 1), np.int32)
    if _ORDER == U5_ORDER:
        if one:
            _quantize_u5_one(x, A, S, C)
        else:
            _quantize_u5(x, A, S, C)
    elif _ORDER == U4_ORDER:
        if one:
            _quantize_u4_one(x, A, S, N, group)
        else:
            _quantize_u4(x, A, S, N, group)
    elif _ORDER == K4_ORDER:
        if one:
            _quantize_k4_one(x, A, S, N, C, group)
        else:
            _quantize_k4(x, A, S, N, C, group)
    elif _ORDER == U6_ORDER:
        if one:
            _quantize_u6_one(x, A, S, group)
            _u6_offsets_one(A, C)
        else:
            _quantize_u6(x, A, S, group)
            _u6_offsets(A, C)
    elif one:
        _quantize_i8_one(x, A, S, group)
    else:
        _quantize_i8(x, A, S, group)
    return A, S, N, C


# one kernel per order: a first run compiles the quantizers of the orders its model uses,
# not all ten (BENCHMARKS.md: what one product holding them all cost)
quantize_plain, quantize_u4, quantize_u6, quantize_k4, quantize_u5 = (
    specialize(_quantize_in, f"quantize_{name}", _ORDER=order) for name, order in zip(ORDER_NAMES, ORDERS)
)
QUANTIZERS = dict(zip(ORDERS, (quantize_plain, quantize_u4, quantize_u6, quantize_k4, quantize_u5)))

