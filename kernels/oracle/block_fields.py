"""Readers of the packed fields inside GGUF quant blocks, for the kernels that repack them.

Each takes blocks as uint8 arrays in ggml's `block_*` layouts (ggml-common.h) and returns
the field's values, unchanged: the repackers (cpu_quant.py) and llama.cpp's
numerics (llama_cpp/llama_numerics.py) read scales and codes with these, while whole-tensor
dequantization is gguf-py's own (oracle/quants.py).
"""

from __future__ import annotations

import numpy as np


def f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] little-endian fp16 bytes -> [n, 1] float32."""
    return b.view(np.float16).astype(np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., k] bytes -> [..., 2, k] uint8: low nibbles, then high nibbles."""
    q = np.empty(qs.shape[:-1] + (2, qs.shape[-1]), dtype=np.uint8)
    np.bitwise_and(qs, 0x0F, out=q[..., 0, :])
    np.right_shift(qs, 4, out=q[..., 1, :])
    return q


def q5_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """5-bit codes [n, 32] uint8 from qh [n, 4] (uint32 LE, bit j = bit 4 of element j)
    and qs [n, 16] (element j's low 4 bits: nibble j % 16, low half first)."""
    n = qs.shape[0]
    q = nibbles(qs).reshape(n, 32)
    high = np.unpackbits(qh, axis=1, bitorder="little")  # [n, 32] 0/1
    high <<= 4
    q |= high
    return q


def k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of packed 6-bit (scale, min) pairs [n, 12] -> two [n, 8] uint8."""
    n = s.shape[0]
    sc = np.empty((n, 8), dtype=np.uint8)
    mn = np.empty((n, 8), dtype=np.uint8)
    np.bitwise_and(s[:, 0:4], 63, out=sc[:, :4])
    np.bitwise_and(s[:, 4:8], 63, out=mn[:, :4])
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn
