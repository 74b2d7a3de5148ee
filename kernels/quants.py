"""Dequantization of GGUF / ggml tensor types to float32, in vectorized numpy.

A GGUF tensor is stored row by row (the last numpy axis is the contiguous row), and each
row is a whole number of *blocks*: a block packs `elements_per_block` values into
`bytes_per_block` bytes (fp16 scales, then packed integer codes). The layouts here
follow ggml's `block_*` structs (ggml-common.h) and its reference `dequantize_row_*`
functions, and give the same float32 bits: every product of a fp16 scale and a small
integer code is exact in float32, and the one rounding step (adding or subtracting the
block minimum) happens in the same order as in ggml.

Every kernel works on many blocks at once; `dequantize` walks a large tensor in chunks
of blocks so that the integer temporaries stay small (about `_CHUNK_ELEMENTS` values).
Data is read as little-endian, as GGUF stores it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as QT

__all__ = [
    "BLOCK_SHAPES",
    "UnsupportedTensorType",
    "block_layout",
    "dequantize",
    "dequantize_rows",
]

QK_K = 256  # elements in one K-quant super-block
_CHUNK_ELEMENTS = 1 << 16  # values dequantized per step (256 KiB of float32 output)


class UnsupportedTensorType(ValueError):
    """The tensor's ggml type has no dequantization kernel here."""


# (elements_per_block, bytes_per_block) of every supported type.
BLOCK_SHAPES: dict[QT, tuple[int, int]] = {
    QT.F32: (1, 4),
    QT.F16: (1, 2),
    QT.BF16: (1, 2),
    QT.Q4_0: (32, 2 + 16),
    QT.Q4_1: (32, 2 + 2 + 16),
    QT.Q5_0: (32, 2 + 4 + 16),
    QT.Q5_1: (32, 2 + 2 + 4 + 16),
    QT.Q8_0: (32, 2 + 32),
    QT.Q2_K: (QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    QT.Q3_K: (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    QT.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2),
    QT.Q5_K: (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    QT.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}

_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8)  # the four 2-bit fields of a byte
_SHIFT_1BIT = np.arange(8, dtype=np.uint8)  # the eight bits of a byte


def _qtype(qtype) -> QT:
    try:
        return QT(qtype)
    except ValueError:
        raise UnsupportedTensorType(f"unknown ggml tensor type {qtype!r}") from None


def block_layout(qtype) -> tuple[int, int]:
    """(elements_per_block, bytes_per_block) of `qtype`; UnsupportedTensorType if none."""
    qt = _qtype(qtype)
    if qt not in BLOCK_SHAPES:
        raise UnsupportedTensorType(f"no dequantization kernel for ggml type {qt.name}")
    return BLOCK_SHAPES[qt]


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] little-endian fp16 bytes -> [n, 1] float32."""
    return b.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., k] bytes -> [..., 2, k] uint8: low nibbles, then high nibbles."""
    q = np.empty(qs.shape[:-1] + (2, qs.shape[-1]), dtype=np.uint8)
    np.bitwise_and(qs, 0x0F, out=q[..., 0, :])
    np.right_shift(qs, 4, out=q[..., 1, :])
    return q


# ---- kernels: blocks [n, bytes_per_block] uint8 -> out [n, elements_per_block] float32 ----


def _dq_f32(b: np.ndarray, out: np.ndarray) -> None:
    out[...] = b.view(np.float32)


def _dq_f16(b: np.ndarray, out: np.ndarray) -> None:
    out[...] = b.view(np.float16)


def _dq_bf16(b: np.ndarray, out: np.ndarray) -> None:
    # bfloat16 is the top half of a float32
    np.left_shift(b.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)


def _dq_q8_0(b: np.ndarray, out: np.ndarray) -> None:
    # block_q8_0: d fp16, qs int8[32]; y = qs * d
    np.multiply(b[:, 2:].view(np.int8), _f16(b[:, 0:2]), out=out)


def _dq_q4_0(b: np.ndarray, out: np.ndarray) -> None:
    # block_q4_0: d, qs[16]; element j is the low nibble of qs[j], j+16 the high; y = (q-8)*d
    n = b.shape[0]
    q = _nibbles(b[:, 2:18]).reshape(n, 32)
    q -= 8  # wraps in uint8; read back as int8 it is q - 8
    np.multiply(q.view(np.int8), _f16(b[:, 0:2]), out=out)


def _dq_q4_1(b: np.ndarray, out: np.ndarray) -> None:
    # block_q4_1: d, m, qs[16]; y = q*d + m
    n = b.shape[0]
    q = _nibbles(b[:, 4:20]).reshape(n, 32)
    np.multiply(q, _f16(b[:, 0:2]), out=out)
    np.add(out, _f16(b[:, 2:4]), out=out)


def _q5(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """5-bit codes [n, 32] from qh (uint32 LE, bit j = bit 4 of element j) and qs[16]."""
    n = qs.shape[0]
    q = _nibbles(qs).reshape(n, 32)
    high = np.unpackbits(qh, axis=1, bitorder="little")  # [n, 32] 0/1
    high <<= 4
    q |= high
    return q


def _dq_q5_0(b: np.ndarray, out: np.ndarray) -> None:
    # block_q5_0: d, qh[4], qs[16]; y = (q-16)*d
    q = _q5(b[:, 2:6], b[:, 6:22])
    q -= 16
    np.multiply(q.view(np.int8), _f16(b[:, 0:2]), out=out)


def _dq_q5_1(b: np.ndarray, out: np.ndarray) -> None:
    # block_q5_1: d, m, qh[4], qs[16]; y = q*d + m
    q = _q5(b[:, 4:8], b[:, 8:24])
    np.multiply(q, _f16(b[:, 0:2]), out=out)
    np.add(out, _f16(b[:, 2:4]), out=out)


def _dq_q2_k(b: np.ndarray, out: np.ndarray) -> None:
    # block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
    # Element h*128 + j*32 + l is bits 2j..2j+1 of qs[h*32 + l]; sub-block = element // 16.
    n = b.shape[0]
    sc = b[:, 0:16]
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    q = qs >> _SHIFT_2BIT.reshape(1, 1, 4, 1)  # [n, 2, 4, 32]
    q &= 3
    scale = _f16(b[:, 80:82]) * (sc & 0x0F)  # [n, 16]
    minimum = _f16(b[:, 82:84]) * (sc >> 4)  # [n, 16]
    out3 = out.reshape(n, 16, 16)
    np.multiply(q.reshape(n, 16, 16), scale[:, :, None], out=out3)
    np.subtract(out3, minimum[:, :, None], out=out3)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """12 bytes of packed 6-bit scales [n, 12] -> [n, 16] int8 scales (already minus 32)."""
    n = s.shape[0]
    r = np.empty((n, 4, 4), dtype=np.uint8)
    np.bitwise_and(s[:, 0:4], 0x0F, out=r[:, 0])
    np.bitwise_and(s[:, 4:8], 0x0F, out=r[:, 1])
    np.right_shift(s[:, 0:4], 4, out=r[:, 2])
    np.right_shift(s[:, 4:8], 4, out=r[:, 3])
    high = s[:, None, 8:12] >> _SHIFT_2BIT.reshape(1, 4, 1)  # [n, 4, 4]: group g, bits 2g..
    high &= 3
    high <<= 4
    r |= high
    r -= 32
    return r.view(np.int8).reshape(n, 16)


def _dq_q3_k(b: np.ndarray, out: np.ndarray) -> None:
    # block_q3_K: hmask[32], qs[64], scales[12], d.
    # Element h*128 + j*32 + l: low 2 bits from bits 2j.. of qs[h*32 + l], third bit is
    # bit 4h+j of hmask[l]; q = low + 4*bit - 4. Sub-block = element // 16.
    n = b.shape[0]
    qs = b[:, 32:96].reshape(n, 2, 1, 32)
    q = qs >> _SHIFT_2BIT.reshape(1, 1, 4, 1)  # [n, 2, 4, 32]
    q &= 3
    high = b[:, None, 0:32] >> _SHIFT_1BIT.reshape(1, 8, 1)  # [n, 8, 32]
    high &= 1
    high <<= 2
    q |= high.reshape(n, 2, 4, 32)
    q -= 4
    scale = _f16(b[:, 108:110]) * _q3_k_scales(b[:, 96:108])  # [n, 16]
    np.multiply(q.view(np.int8).reshape(n, 16, 16), scale[:, :, None], out=out.reshape(n, 16, 16))


def _k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes of packed 6-bit (scale, min) pairs [n, 12] -> two [n, 8] uint8."""
    n = s.shape[0]
    sc = np.empty((n, 8), dtype=np.uint8)
    mn = np.empty((n, 8), dtype=np.uint8)
    np.bitwise_and(s[:, 0:4], 63, out=sc[:, :4])
    np.bitwise_and(s[:, 4:8], 63, out=mn[:, :4])
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _dq_k4_affine(b: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """Q4_K / Q5_K tail: y = (d*scale) * q - (dmin*min) over 8 sub-blocks of 32."""
    n = b.shape[0]
    sc, mn = _k4_scales_mins(b[:, 4:16])
    scale = _f16(b[:, 0:2]) * sc  # [n, 8]
    minimum = _f16(b[:, 2:4]) * mn  # [n, 8]
    out3 = out.reshape(n, 8, 32)
    np.multiply(q.reshape(n, 8, 32), scale[:, :, None], out=out3)
    np.subtract(out3, minimum[:, :, None], out=out3)


def _dq_q4_k(b: np.ndarray, out: np.ndarray) -> None:
    # block_q4_K: d, dmin, scales[12], qs[128]. Element c*64 + h*32 + l is nibble h of
    # qs[c*32 + l]; sub-block = element // 32.
    n = b.shape[0]
    q = _nibbles(b[:, 16:144].reshape(n, 4, 32))  # [n, 4, 2, 32]
    _dq_k4_affine(b, q, out)


def _dq_q5_k(b: np.ndarray, out: np.ndarray) -> None:
    # block_q5_K: d, dmin, scales[12], qh[32], qs[128]. As Q4_K, plus bit 4 of element
    # s*32 + l is bit s of qh[l].
    n = b.shape[0]
    q = _nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    high = b[:, None, 16:48] >> _SHIFT_1BIT.reshape(1, 8, 1)  # [n, 8, 32]
    high &= 1
    high <<= 4
    q |= high
    _dq_k4_affine(b, q, out)


def _dq_q6_k(b: np.ndarray, out: np.ndarray) -> None:
    # block_q6_K: ql[128], qh[64], scales int8[16], d. Element h*128 + g*32 + l: low
    # nibble (g<2) or high nibble (g>=2) of ql[h*64 + (g%2)*32 + l], bits 2g.. of
    # qh[h*32 + l] on top; q - 32. Sub-block = element // 16; y = (d*scale) * q.
    n = b.shape[0]
    q = _nibbles(b[:, 0:128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)
    high = b[:, 128:192].reshape(n, 2, 1, 32) >> _SHIFT_2BIT.reshape(1, 1, 4, 1)
    high &= 3
    high <<= 4
    q |= high
    q -= 32
    scale = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8)  # [n, 16]
    np.multiply(q.view(np.int8).reshape(n, 16, 16), scale[:, :, None], out=out.reshape(n, 16, 16))


_KERNELS: dict[QT, Callable[[np.ndarray, np.ndarray], None]] = {
    QT.F32: _dq_f32,
    QT.F16: _dq_f16,
    QT.BF16: _dq_bf16,
    QT.Q4_0: _dq_q4_0,
    QT.Q4_1: _dq_q4_1,
    QT.Q5_0: _dq_q5_0,
    QT.Q5_1: _dq_q5_1,
    QT.Q8_0: _dq_q8_0,
    QT.Q2_K: _dq_q2_k,
    QT.Q3_K: _dq_q3_k,
    QT.Q4_K: _dq_q4_k,
    QT.Q5_K: _dq_q5_k,
    QT.Q6_K: _dq_q6_k,
}
assert _KERNELS.keys() == BLOCK_SHAPES.keys()


# ---- public entry points ----


def _as_bytes(data: np.ndarray) -> np.ndarray:
    """Any array (uint8 rows from GGUFReader, or typed F32/F16/BF16) -> flat uint8 view."""
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _row_geometry(qt: QT, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(n_rows, row_elements, blocks_per_row, row_bytes) of a tensor, validated."""
    epb, bpb = block_layout(qt)
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 0 for s in shape):
        raise ValueError(f"bad tensor shape {shape} for {qt.name}")
    row = shape[-1]
    if row % epb:
        raise ValueError(
            f"{qt.name} rows must be whole blocks of {epb} elements; row length is {row}"
        )
    return math.prod(shape[:-1]), row, row // epb, row // epb * bpb


def _dequantize_blocks(kernel, blocks: np.ndarray, epb: int) -> np.ndarray:
    """[n_blocks, bytes_per_block] uint8 -> [n_blocks, epb] float32, chunk by chunk."""
    n_blocks = blocks.shape[0]
    out = np.empty((n_blocks, epb), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // epb)
    # inf/nan scales (corrupt files, random bytes) give inf/nan values, as in ggml, quietly
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, n_blocks, step):
            kernel(blocks[start : start + step], out[start : start + step])
    return out


def dequantize(data: np.ndarray, qtype, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of a ggml tensor of `qtype` and numpy `shape` stored in `data`.

    `data` is the tensor's raw bytes (any dtype, viewed as bytes; GGUFReader's
    `ReaderTensor.data` works as is, uint8 rows or typed arrays). `shape` is in numpy
    order: the last dimension is the contiguous row and must be a whole number of blocks.
    Returns a new float32 array of `shape`. Raises UnsupportedTensorType for a type with
    no kernel, ValueError when `data` is not exactly the size `shape` needs.
    """
    qt = _qtype(qtype)
    n_rows, _, blocks_per_row, row_bytes = _row_geometry(qt, shape)
    epb, bpb = BLOCK_SHAPES[qt]
    raw = _checked_bytes(data, qt, shape, n_rows * row_bytes)
    blocks = raw.reshape(n_rows * blocks_per_row, bpb)
    return _dequantize_blocks(_KERNELS[qt], blocks, epb).reshape(shape)


def _checked_bytes(data: np.ndarray, qt, shape: tuple[int, ...], size: int) -> np.ndarray:
    """data as raw bytes; ValueError unless it is exactly the `size` bytes `shape` needs."""
    raw = _as_bytes(data)
    if raw.size != size:
        raise ValueError(f"{qt.name} tensor of shape {tuple(shape)} needs {size} bytes, got {raw.size}")
    return raw


def dequantize_rows(data: np.ndarray, qtype, shape: tuple[int, ...], rows) -> np.ndarray:
    """The float32 values of selected rows of a ggml tensor, without touching the others.

    Rows index the tensor viewed as [n_rows, shape[-1]] (all leading dimensions
    flattened), as an embedding lookup does with token ids. `rows` is any integer array;
    the result has shape `rows.shape + (shape[-1],)`. Raises IndexError for a row outside
    [0, n_rows), and whatever `dequantize` raises for bad types or sizes.
    """
    qt = _qtype(qtype)
    n_rows, row, _, row_bytes = _row_geometry(qt, shape)
    epb, bpb = BLOCK_SHAPES[qt]
    raw = _checked_bytes(data, qt, shape, n_rows * row_bytes)
    idx = np.asarray(rows)
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"row indices must be integers, got {idx.dtype}")
    idx = idx.astype(np.intp, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise IndexError(f"row index out of range [0, {n_rows}): {idx.min()}..{idx.max()}")
    picked = raw.reshape(n_rows, row_bytes)[idx.reshape(-1)]  # [k, row_bytes]
    blocks = picked.reshape(-1, bpb)
    return _dequantize_blocks(_KERNELS[qt], blocks, epb).reshape(idx.shape + (row,))
