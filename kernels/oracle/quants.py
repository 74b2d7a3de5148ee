"""Dequantization of GGUF / ggml tensors to float32: gguf-py's own block dequantizers,
applied chunk by chunk, with the checks a file from outside needs.

A GGUF tensor is stored row by row (the last numpy axis is the contiguous row), and each
row is a whole number of *blocks*: a block packs `elements_per_block` values into
`bytes_per_block` bytes (fp16 scales, then packed integer codes), as ggml's `block_*`
structs (ggml-common.h) lay them out. gguf-py (`gguf.quants`) decodes every block type
as ggml's reference `dequantize_row_*` does; this module does not repeat that. It adds
what the engine needs around it:

- `BLOCK_SHAPES`: the types the engine accepts (those its tests cover on every device);
- sizes checked before any byte is read (a file's header cannot make it read past a
  tensor), and clear errors for types it does not accept;
- a large tensor walked in chunks of about `_CHUNK_ELEMENTS` values, so that gguf's
  integer temporaries stay small (a whole 151936 x 896 embedding at once would take
  gigabytes of them);
- `dequantize_rows`: a few rows (an embedding lookup) without touching the others.

inf/nan scales (corrupt files, random bytes) give inf/nan values, as in ggml, quietly;
models/weight_check.py refuses such files at load.
"""

from __future__ import annotations

import math

import gguf.quants
import numpy as np
from gguf import GGMLQuantizationType as QT

__all__ = [
    "BLOCK_SHAPES",
    "UnsupportedTensorType",
    "block_layout",
    "dequantize",
    "dequantize_rows",
    "qtype_of",
]

_CHUNK_ELEMENTS = 1 << 16  # values dequantized per step (256 KiB of float32 output)


class UnsupportedTensorType(ValueError):
    """The tensor's ggml type is not one the engine reads."""


_ACCEPTED = (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
             QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K)
# (elements_per_block, bytes_per_block) of every accepted type, as gguf-py states them
BLOCK_SHAPES: dict[QT, tuple[int, int]] = {qt: gguf.GGML_QUANT_SIZES[qt] for qt in _ACCEPTED}


def qtype_of(qtype: QT | int) -> QT:
    """`qtype` (a QT or its number) as a QT; UnsupportedTensorType for an unknown number."""
    try:
        return QT(qtype)
    except ValueError:
        raise UnsupportedTensorType(f"unknown ggml tensor type {qtype!r}") from None


def block_layout(qtype: QT | int) -> tuple[int, int]:
    """(elements_per_block, bytes_per_block) of `qtype`; UnsupportedTensorType if not accepted."""
    qt = qtype_of(qtype)
    if qt not in BLOCK_SHAPES:
        raise UnsupportedTensorType(f"no dequantization kernel for ggml type {qt.name}")
    return BLOCK_SHAPES[qt]


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
        raise ValueError(f"{qt.name} rows must be whole blocks of {epb} elements; row length is {row}")
    return math.prod(shape[:-1]), row, row // epb, row // epb * bpb


def _checked_bytes(data: np.ndarray, qt: QT, shape: tuple[int, ...], size: int) -> np.ndarray:
    """data as raw bytes; ValueError unless it is exactly the `size` bytes `shape` needs."""
    raw = _as_bytes(data)
    if raw.size != size:
        raise ValueError(f"{qt.name} tensor of shape {tuple(shape)} needs {size} bytes, got {raw.size}")
    return raw


def _dequantize_blocks(qt: QT, blocks: np.ndarray) -> np.ndarray:
    """blocks [n_blocks, bytes_per_block] uint8 -> [n_blocks, elements_per_block] float32,
    through gguf-py, chunk by chunk."""
    epb, _ = BLOCK_SHAPES[qt]
    out = np.empty((blocks.shape[0], epb), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // epb)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, blocks.shape[0], step):
            chunk = blocks[start : start + step]  # as one row: gguf splits a tensor's rows into groups of 16
            out[start : start + step] = gguf.quants.dequantize(chunk.reshape(1, -1), qt).reshape(chunk.shape[0], epb)
    return out


def dequantize(data: np.ndarray, qtype: QT | int, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of a ggml tensor of `qtype` and numpy `shape` stored in `data`.

    `data` is the tensor's raw bytes (any dtype, viewed as bytes; GGUFReader's
    `ReaderTensor.data` works as is, uint8 rows or typed arrays). `shape` is in numpy
    order: the last dimension is the contiguous row and must be a whole number of blocks.
    Returns a new float32 array of `shape`. Raises UnsupportedTensorType for a type not
    accepted, ValueError when `data` is not exactly the size `shape` needs.
    """
    qt = qtype_of(qtype)
    n_rows, _, blocks_per_row, row_bytes = _row_geometry(qt, shape)
    raw = _checked_bytes(data, qt, shape, n_rows * row_bytes)
    blocks = raw.reshape(n_rows * blocks_per_row, BLOCK_SHAPES[qt][1])
    return _dequantize_blocks(qt, blocks).reshape(shape)


def dequantize_rows(data: np.ndarray, qtype: QT | int, shape: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """The float32 values of selected rows of a ggml tensor, without touching the others.

    Rows index the tensor viewed as [n_rows, shape[-1]] (all leading dimensions
    flattened), as an embedding lookup does with token ids. `rows` is any integer array;
    the result has shape `rows.shape + (shape[-1],)`. Raises IndexError for a row outside
    [0, n_rows), and whatever `dequantize` raises for bad types or sizes.
    """
    qt = qtype_of(qtype)
    n_rows, row, _, row_bytes = _row_geometry(qt, shape)
    raw = _checked_bytes(data, qt, shape, n_rows * row_bytes)
    idx = np.asarray(rows)
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"row indices must be integers, got {idx.dtype}")
    idx = idx.astype(np.intp, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise IndexError(f"row index out of range [0, {n_rows}): {idx.min()}..{idx.max()}")
    picked = raw.reshape(n_rows, row_bytes)[idx.reshape(-1)]  # [k, row_bytes]
    blocks = picked.reshape(-1, BLOCK_SHAPES[qt][1])
    return _dequantize_blocks(qt, blocks).reshape(idx.shape + (row,))
