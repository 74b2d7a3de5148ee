"""numpy reference kernels: the correctness oracle every faster path is checked against.

Parameterised by shapes only; they know no model. All math is float32 with float32
accumulation, as llama.cpp's CPU path does (except where noted). Each token row is
computed on its own (`linear` row by row, `attention` query by query over its visible
keys), so a row's numbers never depend on which rows share its round: a sequence gets
the same bits alone, batched, prefilled, chunked or decoded (tests/test_oracle_rows.py).
"""

from __future__ import annotations

import math

import numpy as np

from zinfer.kernels.oracle.rope import RopeScaling, angles as rope_tables, inv_freq as rope_inv_freq

_GELU_C = math.sqrt(2.0 / math.pi)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x * w / sqrt(mean(x^2) + eps) over the last axis. x [..., d], w [d]."""
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    y: np.ndarray = x * (1.0 / np.sqrt(ms + np.float32(eps))) * w
    return y


OUT_BLOCK = 256  # rows of w per matrix-vector product: a 256-row slice of w stays in cache over every token row


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T (+ b). x [tokens, in], w [out, in] -> [tokens, out].

    Row by row: outputs o:o+OUT_BLOCK of row t are the matrix-vector product
    w[o:o+OUT_BLOCK] @ x[t], the same call whatever the other rows, so a token's output does
    not depend on which tokens share its round. (One matrix product of all rows would let
    BLAS pick its summation order by the number of rows.)
    """
    y = np.empty((x.shape[0], w.shape[0]), np.result_type(x, w))  # [tokens, out]
    rows = np.ascontiguousarray(x)[:, :, None]  # [tokens, in, 1]: np.matmul takes one gemv per token
    for o in range(0, w.shape[0], OUT_BLOCK):
        np.matmul(w[o : o + OUT_BLOCK], rows, out=y[:, o : o + OUT_BLOCK, None])
    if b is not None:
        y += b
    return y


def silu(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = x / (1.0 + np.exp(-x))
    return y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's gelu_pytorch_tanh, ggml's gelu)."""
    y: np.ndarray = 0.5 * x * (1.0 + np.tanh(np.float32(_GELU_C) * (x + np.float32(0.044715) * x * x * x)))
    return y


def glu(gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
    """act(gate) * up: SwiGLU for act='silu', GeGLU for act='gelu_tanh'. [tokens, d_ff]."""
    fn = silu if act == "silu" else gelu_tanh
    y: np.ndarray = fn(gate) * up
    return y


def rope_angles(
    positions: np.ndarray,
    base: float,
    rope_dim: int,
    scaling: RopeScaling | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of pos * base^(-2i/rope_dim), each [tokens, rope_dim/2]; with `scaling`,
    llama.cpp's scaled angles and magnitude (oracle/rope.py)."""
    inv_freq, mscale = rope_inv_freq(base, rope_dim, scaling)
    return rope_tables(np, positions, inv_freq, mscale)


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    base: float,
    rope_dim: int,
    interleaved: bool,
    scaling: RopeScaling | None = None,
) -> np.ndarray:
    """Rotate the first rope_dim dims of each head; x [tokens, heads, head_dim], new array.

    interleaved: pairs (2i, 2i+1) (llama.cpp normal mode on permuted GGUF llama Q/K);
    else halves (i, i + rope_dim/2) (HF / NEOX mode). scaling: as rope_angles.
    """
    cos, sin = rope_angles(positions, base, rope_dim, scaling)
    cos, sin = cos[:, None, :], sin[:, None, :]  # [tokens, 1, rope_dim/2]
    out = x.copy()
    if interleaved:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    else:
        half = rope_dim // 2
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    return out


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    p: np.ndarray = e / np.sum(e, axis=axis, keepdims=True)
    return p


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_pos: np.ndarray,
    scale: float,
    window: int = 0,
) -> np.ndarray:
    """Causal (optionally sliding-window) attention of one sequence, grouped-query.

    q [n, n_heads, hd] at positions q_pos [n]; k, v [ctx, n_kv, hd] at positions 0..ctx-1.
    Key j is visible to query i when j <= q_pos[i] and (window == 0 or q_pos[i] - j < window).
    Returns [n, n_heads, hd].

    One query at a time over exactly its visible keys: a query's output is the same whether
    it comes in a prefill, a chunk or a decode step, whatever else the round holds.
    """
    n, n_heads, hd = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    out = np.empty_like(q)  # [n, n_heads, hd]
    for i in range(n):
        end = int(q_pos[i]) + 1
        begin = max(0, end - window) if window else 0
        qi = q[i].reshape(n_kv, group, hd)  # query heads grouped by their KV head
        scores = (qi @ k[begin:end].transpose(1, 2, 0)) * np.float32(scale)  # [n_kv, group, end - begin]
        out[i] = (softmax(scores) @ v[begin:end].transpose(1, 0, 2)).reshape(n_heads, hd)
    return out
