"""llama.cpp's CPU float ops reproduced bit for bit in numpy (x86-64, AVX-512 build).

The companion of llama_numerics.py (quantized products). Each function follows the
order of operations of ggml's CPU kernel, including where GCC contracts a*b + c into a
fused multiply-add and where ggml uses its own vector exp:

- rms_norm: sum of squares in double, scale = 1/sqrtf(mean + eps), x * scale * w.
- rope: angles theta_i = p * s^i by repeated float multiplication, glibc sinf/cosf,
  rotation x0*cos - x1*sin with one rounding for the first product (fma).
- attention: q.k by ggml_vec_dot_f32 (4 x 16 lanes over steps of 64), softmax with
  ggml_v_expf and a double sum of 16-lane partial sums, p.v by llamafile's tinyBLAS
  (one 16-lane accumulator over steps of 16).
- silu / GELU: ggml_v_silu (x / (1 + v_expf(-x))) and the fp16 GELU table.

They are slower than the float32 oracle (float64 emulation of every fma) and exist so
that greedy decoding can follow llama.cpp through near-ties.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from zinfer.kernels.oracle.rope import RopeScaling, yarn_corr_dims, yarn_mscale, yarn_ramp

f32 = np.float32


def fma(a: np.ndarray | np.float32, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    """float32 a*b + c with one rounding (float64 holds a float32 product exactly)."""
    y: np.ndarray = (np.asarray(a, np.float64) * b + c).astype(f32)
    return y


def _reduce16(x: np.ndarray) -> np.ndarray:
    """_mm512_reduce_add_ps over the last axis (16 lanes), as GCC implements it."""
    t = x[..., 8:] + x[..., :8]
    t = t[..., 4:] + t[..., :4]
    y: np.ndarray = (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])
    return y


def vec_dot_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 (AVX-512) over the last axis; a, b broadcast, length a multiple of 64."""
    n = a.shape[-1]
    shape = np.broadcast_shapes(a.shape, b.shape)[:-1] + (4, 16)
    acc = np.zeros(shape, f32)
    for i in range(0, n, 64):
        a_step = a[..., i : i + 64].reshape(a.shape[:-1] + (4, 16))
        b_step = b[..., i : i + 64].reshape(b.shape[:-1] + (4, 16))
        acc = fma(a_step, b_step, acc)
    x0 = acc[..., 0, :] + acc[..., 2, :]
    x1 = acc[..., 1, :] + acc[..., 3, :]
    return _reduce16(x0 + x1)


def sgemm_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """llamafile_sgemm's float32 dot (AVX-512) over the last axis, a multiple of 16 long."""
    acc = np.zeros(np.broadcast_shapes(a.shape, b.shape)[:-1] + (16,), f32)
    for i in range(0, a.shape[-1], 16):
        acc = fma(a[..., i : i + 16], b[..., i : i + 16], acc)
    return _reduce16(acc)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm then ggml_mul: x [..., d] float32, w [d]."""
    ss = np.sum(np.square(x, dtype=f32), axis=-1, keepdims=True, dtype=np.float64)
    mean = (ss / x.shape[-1]).astype(f32)
    scale = f32(1.0) / np.sqrt(mean + f32(eps))
    y: np.ndarray = (x * scale) * w
    return y


@functools.cache
def _libm() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("m")
    lib = ctypes.CDLL(name) if name else None
    if lib is not None:
        for fn in ("sinf", "cosf", "tanhf"):
            getattr(lib, fn).restype = ctypes.c_float
            getattr(lib, fn).argtypes = [ctypes.c_float]
    return lib


@functools.lru_cache(maxsize=4096)
def _rope_row(p: int, base: float, rope_dim: int, scaling: RopeScaling | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [rope_dim/2] for position p, as ggml_rope_cache_init builds them."""
    step = f32(np.power(np.float64(base), -2.0 / rope_dim))  # powf, correctly rounded
    theta = np.empty(rope_dim // 2, f32)
    t = f32(p)
    for i in range(rope_dim // 2):
        theta[i] = t
        t = f32(t * step)
    mscale = f32(1)
    if scaling is not None and not scaling.is_identity:
        theta, mscale = _yarn_theta(theta, float(base), rope_dim, scaling)
    lib = _libm()
    if lib is None:  # no C library to call: correctly rounded values (glibc's, nearly always)
        cos, sin = np.cos(theta.astype(np.float64)).astype(f32), np.sin(theta.astype(np.float64)).astype(f32)
    else:
        cos = np.array([lib.cosf(float(v)) for v in theta], f32)
        sin = np.array([lib.sinf(float(v)) for v in theta], f32)
    return (cos, sin) if mscale == 1 else (cos * mscale, sin * mscale)


def _yarn_theta(theta: np.ndarray, base: float, rope_dim: int, s: RopeScaling) -> tuple[np.ndarray, np.float32]:
    """rope_yarn's angles [rope_dim/2] from the unscaled ones, and its magnitude: theta/ff,
    freq_scale times that, and YaRN's mix theta_interp*(1-mix) + theta_extrap*mix with
    the first product fused (GCC's contraction)."""
    extrap = theta / np.asarray(s.freq_factors, f32) if s.freq_factors else theta
    interp = f32(s.freq_scale) * extrap
    if s.ext_factor == 0.0:
        return interp.astype(f32), f32(s.attn_factor)
    low, high = yarn_corr_dims(rope_dim, s.original_context, base, s.beta_fast, s.beta_slow)
    mix = yarn_ramp(rope_dim, low, high) * f32(s.ext_factor)
    return fma(interp, f32(1) - mix, extrap * mix), yarn_mscale(s)


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    base: float,
    rope_dim: int,
    interleaved: bool,
    scaling: RopeScaling | None = None,
) -> np.ndarray:
    """ggml_rope_ext (normal mode when interleaved, else NEOX) on x [T, heads, head_dim];
    scaling: llama.cpp's freq_scale, YaRN and freq_factors (oracle/rope.py)."""
    rows = [_rope_row(int(p), float(base), rope_dim, scaling) for p in positions]
    cos = np.stack([r[0] for r in rows])[:, None, :]  # [T, 1, rope_dim/2]
    sin = np.stack([r[1] for r in rows])[:, None, :]
    out = x.copy()
    if interleaved:
        lo, hi = slice(0, rope_dim, 2), slice(1, rope_dim, 2)
    else:
        lo, hi = slice(0, rope_dim // 2), slice(rope_dim // 2, rope_dim)
    x0, x1 = x[..., lo], x[..., hi]
    out[..., lo] = fma(x0, cos, -(x1 * sin))
    out[..., hi] = fma(x0, sin, x1 * cos)
    return out


def _hex(s: str) -> np.float32:
    return f32(float.fromhex(s))


_E = [_hex(s) for s in ("0x1.8p23", "0x1.715476p+0", "0x1.7f7d1cp-20", "0x1.62e4p-1", "0x1.0e4020p-7",
                        "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")]


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (AVX-512): ARM's expf polynomial; 0 for large negative, inf for large positive."""
    r, log2e, ln2_lo, ln2_hi, c5, c4, c3, c2, c1 = _E
    x = np.asarray(x, f32)
    with np.errstate(invalid="ignore", over="ignore"):
        z = fma(x, log2e, r)
        n = z - r
        b = fma(-n, ln2_lo, fma(-n, ln2_hi, x))
        u = b * b
        j = fma(fma(fma(c5, b, c4), u, fma(c3, b, c2)), u, fma(c1, b, f32(1.0)))
        big = ~(np.abs(n) <= 192)
        res = np.ldexp(j, np.where(big, 0, n).astype(np.int32)).astype(f32)
    return np.where(big, np.where(n <= 0, f32(0.0), f32(np.inf)), res)


def silu(x: np.ndarray) -> np.ndarray:
    """ggml_v_silu: x / (1 + v_expf(-x))."""
    return x / (f32(1.0) + v_expf(-x))


def softmax(w: np.ndarray) -> np.ndarray:
    """ggml_soft_max over the last axis (masked entries -inf; length a multiple of 16)."""
    e = v_expf(w - w.max(axis=-1, keepdims=True))
    parts = _reduce16(e.reshape(e.shape[:-1] + (-1, 16))).astype(np.float64)  # [..., n/16]
    total = np.zeros(parts.shape[:-1], np.float64)
    for i in range(parts.shape[-1]):  # sum += (ggml_float) chunk, in order
        total += parts[..., i]
    return e * (1.0 / total).astype(f32)[..., None]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, scale: float, window: int) -> np.ndarray:
    """llama.cpp's attention without flash attention, f32 KV: q [n, H, hd], k/v [ctx, Hkv, hd]."""
    n, H, hd = q.shape
    ctx, Hkv, _ = k.shape
    padded = -(-ctx // 64) * 64  # zero keys past the context change no sum
    kp = np.zeros((padded, Hkv, hd), f32)
    vp = np.zeros((padded, Hkv, hd), f32)
    kp[:ctx], vp[:ctx] = k, v
    group = H // Hkv
    kh = np.repeat(kp, group, axis=1).transpose(1, 0, 2)  # [H, padded, hd]
    vt = np.repeat(vp, group, axis=1).transpose(1, 2, 0)  # [H, hd, padded]
    kpos = np.arange(padded)
    visible = (kpos[None, :] <= q_pos[:, None]) & (kpos[None, :] < ctx)
    if window:
        visible &= (q_pos[:, None] - kpos[None, :]) < window
    # p.v: llamafile's sgemm takes products of several query rows; a single row (decode)
    # goes through ggml_vec_dot_f32, whose 4 accumulators differ from 17 keys on
    weighted_sum = vec_dot_f32 if n == 1 else sgemm_dot
    out = np.empty((n, H, hd), f32)
    for i in range(n):
        scores = vec_dot_f32(kh, q[i][:, None, :]) * f32(scale)  # [H, padded]
        p = softmax(np.where(visible[i], scores, f32(-np.inf)))
        out[i] = weighted_sum(vt, p[:, None, :])  # [H, hd]
    return out


@functools.cache
def _gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: fp16 GELU (tanh form) of every fp16 bit pattern, [65536] float32.

    As ggml_gelu_f32 computes it: 0.5x * (1 + tanhf(sqrt(2/pi)x * fma(0.044715x, x, 1)))."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(f32)
    with np.errstate(invalid="ignore", over="ignore"):
        arg = (f32(0.7978845608028654) * x) * fma(f32(0.044715) * x, x, f32(1.0))
        lib = _libm()
        if lib is None:
            t = np.tanh(arg.astype(np.float64)).astype(f32)
        else:
            t = np.array([lib.tanhf(float(a)) for a in arg], f32)
        g = (f32(0.5) * x) * (f32(1.0) + t)
    y: np.ndarray = g.astype(np.float16).astype(f32)
    return y


def gelu_fp16(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU: 0 below -10, x above 10, else a lookup of fp16(x) in the fp16 table."""
    y = _gelu_table()[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, f32(0), np.where(x >= 10, x, y)).astype(np.float32)
