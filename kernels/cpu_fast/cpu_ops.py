"""Elementwise and attention kernels for the fast CPU device, in numba.

Each matches its oracle.reference counterpart in float32 (up to summation order).
They write into a caller-given `out`, so the device decides where memory comes from.
"""

from __future__ import annotations

import math
import types
from typing import Any, cast

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba import types as nt

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.gemm_ir import MR as GEMM_MR
from zinfer.kernels.cpu_fast.gemm_ir import NR as GEMM_NR
from zinfer.kernels.cpu_fast.gemm_ir import GemmArgs
from zinfer.kernels.cpu_fast.kernel_signature import call_kernel
from zinfer.kernels.cpu_fast.numba_types import F, Float, Int, Typing, intrinsic

_GELU_C = np.float32(math.sqrt(2.0 / math.pi))
PARALLEL_ROWS = 8  # rows from which the elementwise kernels run on every thread


def compile_twice(body: F, **flags: Any) -> tuple[F, F]:
    """body compiled for every thread (its prange loops parallel) and, as body_one, for
    one: on small inputs a parallel launch (~3 us) costs more than the work. The copy
    gets its own name so that numba's on-disk cache keeps the two apart."""
    one = types.FunctionType(body.__code__, body.__globals__, body.__name__ + "_one", body.__defaults__,
                             body.__closure__)
    one.__qualname__ = body.__qualname__ + "_one"
    flags = {"nogil": True, "error_model": "numpy", **flags}
    return cached_njit(parallel=True, **flags)(body), cast(F, cached_njit(**flags)(one))


def specialize(body: F, name: str, **constants: Any) -> F:
    """body compiled as kernel `name` with `constants` bound as its globals: numba folds
    them at compile time and drops the branches they rule out, so a kernel that would
    compile every variant of its callees compiles only its own. Bind the result to
    module-level `name` (numba's cache and the compile helper find kernels by name)."""
    func = types.FunctionType(body.__code__, {**body.__globals__, **constants}, name, body.__defaults__,
                              body.__closure__)
    func.__qualname__ = name
    return cast(F, cached_njit(nogil=True, error_model="numpy")(func))


# Every kernel here compiles with error_model="numpy": a float division by zero gives inf or NaN
# as IEEE says, where numba's default raises ZeroDivisionError (in a prange loop, a SystemError),
# and a NaN that fast-math arithmetic turned into a zero divisor killed the round.
# Under fastmath, NaN checks on floats fold away: a kernel that must see a NaN or an
# infinity tests the value's bits (f32_bits, NON_FINITE_BITS), which no fast-math flag touches.

NON_FINITE_BITS = np.int32(0x7F800000)  # exponent bits all set: inf or NaN (|v|'s bits >= this)
ABS_BITS = np.int32(0x7FFFFFFF)  # the bits of |v|: for v >= 0, bits order as values do


# ---- scalar helpers that LLVM vectorizes: exp (numba's np.exp is a libm call per element), f16 -> f32 ----


@intrinsic
def _f32_from_bits(typingctx: Any, bits: Any) -> Typing:
    """The float32 whose bit pattern is the int32 `bits`."""
    sig = nt.float32(nt.int32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def fma32(typingctx: Any, a: Any, b: Any, c: Any) -> Typing:
    """a * b + c for float32s, rounded once (llvm.fma: the hardware's fma, never split)."""
    sig = nt.float32(nt.float32, nt.float32, nt.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def f32_bits(typingctx: Any, x: Any) -> Typing:
    """The bit pattern of float32 x as an int32."""
    sig = nt.int32(nt.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def as_f32(typingctx: Any, x: Any) -> Typing:
    """x as float32: a float32 unchanged, a uint16 read as the bits of an f16 (numba has
    no float16 type; LLVM turns this into vcvtph2ps)."""
    if x == nt.float32:
        return nt.float32(nt.float32), lambda context, builder, signature, args: args[0]
    if x == nt.uint16:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return nt.float32(nt.uint16), codegen
    return None


@intrinsic
def f16_bits(typingctx: Any, x: Any) -> Typing:
    """The bits of float32 x rounded to f16 (to nearest even, as numpy and F16C do)."""
    sig = nt.uint16(nt.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@njit(fastmath=True, inline="always", error_model="numpy")
def fast_exp(x: Float) -> np.float32:
    """exp(x) in float32 to ~1 ulp for x in [-87, 88] (clamped there): Cody-Waite
    reduction x = k ln2 + r and Cephes' degree-6 polynomial for exp(r), scaled by 2^k
    built in the exponent bits."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    k = np.floor(x * np.float32(1.44269504) + np.float32(0.5))
    r = x - k * np.float32(0.693359375) - k * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    two_k: np.float32 = _f32_from_bits((np.int32(k) + np.int32(127)) << np.int32(23))
    e: np.float32 = (p * r * r + r + np.float32(1)) * two_k
    return e


@njit(inline="always")
def _order_key(bits: Int) -> np.int32:
    """An int32 that orders as the finite float32 with these bits does (negative floats'
    magnitude bits flipped), and maps back to the bits when applied again."""
    return np.int32(bits ^ ((bits >> np.int32(31)) & ABS_BITS))


@cached_njit(fastmath=True, nogil=True, error_model="numpy")
def softmax_(row: np.ndarray, scale: Float) -> None:
    """row [n] f32 (n >= 1), in place: softmax(scale * row); all NaN where row holds a NaN
    or an infinity (fast_exp's clamp would turn those into plausible weights)."""
    top_key = np.int32(-2147483648)  # the largest row[j]'s order key (an int32 max vectorizes, a float max did not)
    top = np.int32(0)  # the largest |row[j]|'s bits
    for j in range(row.shape[0]):
        bits = f32_bits(row[j])
        key = _order_key(bits)
        top_key = top_key if top_key >= key else key
        magnitude = np.int32(bits & ABS_BITS)
        top = top if top >= magnitude else magnitude
    if top >= NON_FINITE_BITS:
        row[:] = np.nan
        return
    mx = _f32_from_bits(_order_key(top_key))  # the row's max (_order_key is its own inverse)
    tot = np.float32(0)
    for j in range(row.shape[0]):
        e = fast_exp((row[j] - mx) * scale)
        row[j] = e
        tot += e
    inv = np.float32(1) / tot
    for j in range(row.shape[0]):
        row[j] *= inv


def _store_f16(pool: np.ndarray, slots: np.ndarray, x: np.ndarray) -> None:
    """pool[slots[t]] = x[t] rounded to f16. pool [slots, ...] uint16 (f16 bits); x
    [T, ...] float32 with the same trailing shape, both C-contiguous."""
    T = x.shape[0]
    flat_x = x.reshape(T, -1)
    flat_pool = pool.reshape(pool.shape[0], -1)
    for t in prange(T):
        src, dst = flat_x[t], flat_pool[slots[t]]
        for i in range(src.shape[0]):
            dst[i] = f16_bits(src[i])


store_f16, store_f16_one = compile_twice(_store_f16)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: Float, out: np.ndarray) -> None:
    """out = x * w / sqrt(mean(x^2) + eps) per row. x, out [rows, n], w [n]."""
    rows, n = x.shape
    for r in prange(rows):
        xr = x[r]
        ss = np.float32(0)
        for i in range(n):
            ss += xr[i] * xr[i]
        inv = np.float32(1) / np.sqrt(ss / np.float32(n) + np.float32(eps))
        o = out[r]
        for i in range(n):
            o[i] = xr[i] * inv * w[i]


rms_norm, rms_norm_one = compile_twice(_rms_norm, fastmath=True)


@cached_njit(fastmath=True, nogil=True, error_model="numpy")
def rope_table(positions: np.ndarray, inv_freq: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """cos, sin [T, rope_dim/2] of positions [T] int64 times inv_freq [rope_dim/2] f32:
    one round's angles, shared by q and k of every layer with the same base."""
    for t in range(positions.shape[0]):
        p = np.float32(positions[t])
        for i in range(inv_freq.shape[0]):
            th = p * inv_freq[i]
            cos[t, i], sin[t, i] = np.cos(th), np.sin(th)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, out: np.ndarray) -> None:
    """Rotary embedding of the first 2*cos.shape[1] dims of each head.

    x, out [T, heads, hd] (may alias); cos, sin [T, rope_dim/2] (rope_table).
    interleaved: pairs (2i, 2i+1); else halves (i, i + rope_dim/2).
    """
    T, H, hd = x.shape
    half = cos.shape[1]
    for t in prange(T):
        c, s = cos[t], sin[t]
        for h in range(H):
            xh, oh = x[t, h], out[t, h]
            if interleaved:
                for i in range(half):
                    a, b = xh[2 * i], xh[2 * i + 1]
                    oh[2 * i] = a * c[i] - b * s[i]
                    oh[2 * i + 1] = a * s[i] + b * c[i]
            else:  # contiguous halves: this loop vectorizes
                xa, xb, oa, ob = xh[:half], xh[half : 2 * half], oh[:half], oh[half : 2 * half]
                for i in range(half):
                    a, b = xa[i], xb[i]
                    oa[i] = a * c[i] - b * s[i]
                    ob[i] = a * s[i] + b * c[i]
            for i in range(2 * half, hd):
                oh[i] = xh[i]


# no fastmath: with it, the copy numba compiled and the copy it loaded from its cache
# rounded differently (fma contraction), and int8 rounding downstream turned that
# 1 ulp into different greedy ids between a first run and later ones
rope, rope_one = compile_twice(_rope)


def _glu(gate: np.ndarray, up: np.ndarray, gelu: bool, out: np.ndarray) -> None:
    """out = act(gate) * up; act = gelu_tanh if gelu else silu. All [T, n] (contiguous
    rows: numba does not vectorize strided ones)."""
    T, n = gate.shape
    for t in prange(T):
        g, u, o = gate[t], up[t], out[t]
        for i in range(n):
            v = g[i]
            if gelu:  # 0.5 v (1 + tanh(y)), tanh(y) = 1 - 2 / (exp(2y) + 1)
                y = _GELU_C * (v + np.float32(0.044715) * v * v * v)
                tanh_y = np.float32(1) - np.float32(2) / (fast_exp(np.float32(2) * y) + np.float32(1))
                a = np.float32(0.5) * v * (np.float32(1) + tanh_y)
            else:
                a = v / (np.float32(1) + fast_exp(-v))
            o[i] = a * u[i]


glu, glu_one = compile_twice(_glu, fastmath=True)


@cached_njit(parallel=True, fastmath=True, nogil=True, error_model="numpy")
def paged_attention(
    gemm: Int,
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    rows: np.ndarray,
    positions: np.ndarray,
    row_seq: np.ndarray,
    tables: np.ndarray,
    block_size: Int,
    scale: Float,
    window: Int,
    out: np.ndarray,
) -> None:
    """Causal attention of the token rows `rows` over each one's paged KV, in one kernel.

    q, out [T, H, hd]; k_pool, v_pool [slots, Hkv, hd] float32, or uint16 holding f16;
    rows [n] int64 rows of q to do;
    positions [T]; row_seq [T] index into tables [n_seqs, max_blocks] int32. Row t sees
    keys j <= positions[t] (and positions[t] - j < window when window > 0). Parallel over
    (row, kv head); no per-sequence Python loop. `gemm`: gemm_ir's kernel's address.

    A row's result is chunk attention's (cpu_prefill_attention.py) bit for bit, so a token
    decoded here and the same token prefilled there see the same numbers: the scores come
    from the same GEMM kernel (keys GEMM_NR at a time, transposed), softmax_ takes the raw
    scores and the scale, and each output is the fma chain over the keys in order.
    """
    T, H, hd = q.shape
    Hkv = k_pool.shape[1]
    grp = H // Hkv
    heads = (grp + GEMM_MR - 1) // GEMM_MR * GEMM_MR  # the group's query rows, padded for the kernel
    for item in prange(rows.shape[0] * Hkv):
        t = rows[item // Hkv]
        g = item % Hkv
        p = positions[t]
        lo = max(0, p - window + 1) if window > 0 else 0
        n = p + 1 - lo
        table = tables[row_seq[t]]
        sc = np.empty((grp, n), np.float32)
        qb = np.zeros((heads, hd), np.float32)
        for h in range(grp):
            qb[h] = q[t, g * grp + h]
        kt = np.zeros((hd, GEMM_NR), np.float32)  # a block of keys in f32, transposed
        blk = np.empty((heads, GEMM_NR), np.float32)  # its scores
        row = np.empty(hd, np.float32)  # one key or value in f32
        for j0 in range(0, n, GEMM_NR):
            m = min(GEMM_NR, n - j0)
            for jj in range(m):
                key = lo + j0 + jj
                kv = k_pool[table[key // block_size] * block_size + key % block_size, g]
                for i in range(hd):  # converted in a contiguous row (vectorized), then transposed
                    row[i] = as_f32(kv[i])
                for i in range(hd):
                    kt[i, jj] = row[i]
            for r in range(0, heads, GEMM_MR):
                call_kernel(gemm, GemmArgs(A=qb.ctypes.data + r * hd * 4, lda=hd, B=kt.ctypes.data, ldb=GEMM_NR,
                                           C=blk.ctypes.data + r * GEMM_NR * 4, ldc=GEMM_NR, K=hd))
            for h in range(grp):
                sc[h, j0 : j0 + m] = blk[h, :m]
        for h in range(grp):
            softmax_(sc[h], scale)
            out[t, g * grp + h] = 0
        for j in range(n):
            key = lo + j
            vv = v_pool[table[key // block_size] * block_size + key % block_size, g]
            for i in range(hd):
                row[i] = as_f32(vv[i])
            for h in range(grp):
                o = out[t, g * grp + h]
                pj = sc[h, j]
                for i in range(hd):
                    o[i] = fma32(pj, row[i], o[i])
