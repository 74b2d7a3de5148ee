"""RoPE frequencies with llama.cpp's scaling: linear, YaRN and per-dimension frequency factors.

A rotary table is cos, sin [T, rope_dim/2] of theta[t, i] = pos[t] * inv_freq[i], times
a magnitude `mscale`. Scaling changes only inv_freq and mscale, so every device keeps
its own table and rotation code and asks here for the two.

llama.cpp's rope (ggml-cpu ops.cpp rope_yarn, ggml.c ggml_rope_yarn_corr_dims) on pair i:

    theta_extrap = pos * base^(-2i/d) / freq_factor[i]
    theta_interp = freq_scale * theta_extrap
    YaRN (ext_factor != 0): ramp[i] = 1 - clamp((i - low) / max(0.001, high - low), 0, 1),
        mix = ramp * ext_factor, theta = theta_interp * (1 - mix) + theta_extrap * mix,
        mscale = attn_factor * (1 + 0.1 ln(1 / freq_scale))
    otherwise theta = theta_interp, mscale = attn_factor

where low/high are the YaRN correction dimensions of beta_fast/beta_slow over the
original context. With theta linear in pos, inv_freq folds every factor in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

f32 = np.float32


class RopeScaling(msgspec.Struct, frozen=True):
    """How one layer's RoPE angles are scaled, in llama.cpp's terms (values float32-exact).

    kind: "none", "linear" or "yarn" (what the model file asked for; the math reads the
    fields below). freq_scale: 1 / factor. ext_factor: YaRN's extrapolation mix (1 for
    YaRN, 0 otherwise). attn_factor: llama.cpp's yarn_attn_factor (the magnitude before
    YaRN's own 1 + 0.1 ln(factor)). beta_fast/beta_slow, original_context: YaRN's
    correction range. freq_factors [rope_dim/2]: theta_i is divided by them
    (rope_freqs.weight, Llama 3), () for none.
    """

    kind: str = "none"
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_context: int = 0
    freq_factors: tuple[float, ...] = ()

    @property
    def is_identity(self) -> bool:
        """True when the angles and magnitude are those of plain RoPE."""
        return self.freq_scale == 1.0 and self.ext_factor == 0.0 and self.attn_factor == 1.0 and not self.freq_factors


def scaling_as_llama_cpp(
    kind: str, factor: float, original_context: int, attn_factor: float = 1.0, freq_factors: tuple[float, ...] = ()
) -> RopeScaling:
    """The RopeScaling llama.cpp runs for a model file's scaling type, factor (0: none),
    YaRN original context and rope.scaling.attn_factor, in its float32 steps
    (llama-model.cpp load_hparams, llama-context.cpp's yarn_attn_factor)."""
    if kind not in ("none", "linear", "yarn"):
        raise ValueError(f"unsupported RoPE scaling type {kind!r}")
    freq_scale = f32(1) if kind == "none" or factor == 0.0 else f32(1) / f32(factor)
    ext_factor = 1.0 if kind == "yarn" else 0.0
    attn = f32(1)
    if ext_factor:
        scale = f32(1) / freq_scale
        get_mscale = f32(1) if scale <= 1 else fma(f32(0.1), logf(scale), f32(1))
        attn = f32(get_mscale * (f32(1) / fma(f32(0.1), logf(scale), f32(1))))
    attn = f32(attn * f32(attn_factor))
    ff = tuple(float(f32(v)) for v in freq_factors)
    original = int(original_context) if ext_factor else 0  # only YaRN's ramp reads it
    return RopeScaling(kind, float(freq_scale), ext_factor, float(attn), original_context=original, freq_factors=ff)


def fma(a: Any, b: Any, c: Any) -> np.float32:
    """float32 a*b + c rounded once, as GCC contracts it (float64 holds the product exactly)."""
    return f32(np.float64(a) * np.float64(b) + np.float64(c))


@functools.cache
def _libm_logf() -> Callable[[float], float] | None:
    name = ctypes.util.find_library("m")
    if not name:
        return None
    fn = ctypes.CDLL(name).logf
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    logf: Callable[[float], float] = fn
    return logf


def logf(x: Any) -> np.float32:
    """The C library's logf (llama.cpp's), or numpy's float32 log where there is none."""
    fn = _libm_logf()
    return f32(fn(float(x))) if fn is not None else f32(np.log(f32(x)))


def plain_inv_freq(base: float, rope_dim: int) -> np.ndarray:
    """base^(-2i/rope_dim) [rope_dim/2] float32: unscaled RoPE's frequencies."""
    return (f32(base) ** (-np.arange(0, rope_dim, 2, dtype=f32) / f32(rope_dim))).astype(f32)


def yarn_corr_dims(
    rope_dim: int,
    original_context: int,
    base: float,
    beta_fast: float,
    beta_slow: float,
) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims in float32: the first and last pair index of YaRN's ramp."""

    def corr_dim(n_rot: float) -> np.float32:
        ratio = f32(original_context) / (f32(n_rot) * f32(2) * f32(math.pi))
        return f32(f32(rope_dim) * logf(ratio)) / (f32(2) * logf(base))

    start, end = np.floor(corr_dim(beta_fast)), np.ceil(corr_dim(beta_slow))
    return float(max(f32(0), start)), float(min(f32(rope_dim - 1), end))


def yarn_ramp(rope_dim: int, low: float, high: float) -> np.ndarray:
    """rope_yarn_ramp of every pair [rope_dim/2] float32: 1 where theta extrapolates, 0 where it interpolates."""
    y = (np.arange(rope_dim // 2, dtype=f32) - f32(low)) / max(f32(0.001), f32(high) - f32(low))
    ramp: np.ndarray = (f32(1) - np.minimum(f32(1), np.maximum(f32(0), y))).astype(f32)
    return ramp


def inv_freq(base: float, rope_dim: int, scaling: RopeScaling | None) -> tuple[np.ndarray, np.float32]:
    """(inv_freq [rope_dim/2] float32, mscale float32): theta = pos * inv_freq, cos and sin times mscale."""
    inv = plain_inv_freq(base, rope_dim)
    if scaling is None or scaling.is_identity:
        return inv, f32(1)
    if scaling.freq_factors:
        inv = (inv / np.asarray(scaling.freq_factors, f32)).astype(f32)
    fs = f32(scaling.freq_scale)
    if scaling.ext_factor == 0.0:
        return (inv * fs).astype(f32), f32(scaling.attn_factor)
    low, high = yarn_corr_dims(rope_dim, scaling.original_context, base, scaling.beta_fast, scaling.beta_slow)
    mix = yarn_ramp(rope_dim, low, high) * f32(scaling.ext_factor)
    inv = (inv * (fs * (f32(1) - mix) + mix)).astype(f32)
    return inv, yarn_mscale(scaling)


def yarn_mscale(scaling: RopeScaling) -> np.float32:
    """rope_yarn's magnitude: attn_factor * (1 + 0.1 ln(1 / freq_scale)), float32 as GCC computes it."""
    return f32(f32(scaling.attn_factor) * fma(f32(0.1), logf(f32(1) / f32(scaling.freq_scale)), f32(1)))


def angles(xp: Any, positions: Any, inv: Any, mscale: float | np.float32) -> tuple[Any, Any]:
    """cos, sin [T, rope_dim/2] float32 of positions [T] (xp: numpy or cupy, arrays of it)."""
    theta = positions.astype(xp.float32)[:, None] * inv[None, :]
    cos, sin = xp.cos(theta), xp.sin(theta)
    if mscale != 1.0:
        cos, sin = cos * xp.float32(mscale), sin * xp.float32(mscale)
    return cos, sin


def rotate(xp: Any, x: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
    """x [T, heads, head_dim] rotated by tables cos, sin [T, rope_dim/2]; a new array.

    interleaved: pairs (2i, 2i+1); else halves (i, i + rope_dim/2). Dims past rope_dim are copied."""
    rope_dim = 2 * cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, rope_dim/2]
    out = x.copy()
    if interleaved:
        lo, hi = slice(0, rope_dim, 2), slice(1, rope_dim, 2)
    else:
        lo, hi = slice(0, rope_dim // 2), slice(rope_dim // 2, rope_dim)
    a, b = x[..., lo], x[..., hi]
    out[..., lo] = a * c - b * s
    out[..., hi] = a * s + b * c
    return out
