"""The weights of the AMX products (amx_ir.py) in their tile layout, made once at upload
from the file's blocks (cpu_quant.repack decodes them: the tested path).

Per type: the signed codes the tiles multiply, a float scale per block of `block` columns
and, where the type has one, a float offset per 32 columns (value = code * d + m):

| type | codes | block | d | m |
|------|-------|-------|---|---|
| Q4_0 | code - 8 | 32 | the file's d | none |
| Q4_1 | code (0..15) | 32 | d | m |
| Q4_K | code (0..15) | 32 | d * sub-block scale | -dmin * sub-block min |
| Q5_0 | code - 16 | 32 | d | none |
| Q8_0 | code | 32 | d | none |
| Q6_K | code - 32 | 16 | d * sub-block scale | none |

Every d and m is exact in f32 (cpu_quant forms them so); code * d + m is the oracle's value.

Layout (AmxWeight): codes [rows / 16, nblocks, block / 4, 16, 4] int8: per 16 weight rows
and block, one B tile of block / 4 rows of 64 bytes, byte 4n + c of tile row k = column
4k + c of the block of weight row n (the VNNI layout tdpbssd reads); d and m [rows / 16,
nblocks, 16] f32 (16 rows' scales of a block in one vector). 8 bits a weight plus the
scales: the int8 view (products.py's table) stays beside it for the rounds of few rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.cpu_fast import cpu_quant as cq

ROW_MULTIPLE = 32  # weight rows of a kernel step (2 C tiles)
TYPES = (QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_0, QT.Q8_0, QT.Q6_K)


class AmxWeight(NamedTuple):
    """A matrix [rows, cols] as the AMX kernels read it (the module docstring's layout)."""

    codes: np.ndarray  # [rows / 16, nblocks, block / 4, 16, 4] int8
    d: np.ndarray  # [rows / 16, nblocks, 16] f32
    m: np.ndarray  # as d (offsets), or [1] f32 (none)
    block: int  # columns per scale: 32, or 16 (Q6_K)
    offsets: bool  # whether m is read

    @property
    def nblocks(self) -> int:
        return int(self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.d.nbytes + self.m.nbytes


def tiles(codes: np.ndarray, block: int) -> np.ndarray:
    """codes [rows, cols] int8 -> [rows / 16, cols / block, block / 4, 16, 4]: B tiles (VNNI layout)."""
    rows, cols = codes.shape
    t = codes.reshape(rows // 16, 16, cols // block, block // 4, 4)  # [rt, n, b, k, c]
    out: np.ndarray = np.ascontiguousarray(t.transpose(0, 2, 3, 1, 4))
    return out


def by_tile_rows(values: np.ndarray) -> np.ndarray:
    """values [rows, nblocks] f32 -> [rows / 16, nblocks, 16]: a block's 16 rows contiguous."""
    rows, nblocks = values.shape
    out: np.ndarray = np.ascontiguousarray(values.reshape(rows // 16, 16, nblocks).transpose(0, 2, 1))
    return out.astype(np.float32)


def from_gguf(qt: QT, raw: np.ndarray, shape: tuple[int, int]) -> AmxWeight | None:
    """The tile layout of a matrix of a type of TYPES with rows % ROW_MULTIPLE == 0 (and cols
    % 32 == 0, as its blocks make it), else None (the int8 view's kernels take it)."""
    rows, cols = shape
    if qt not in TYPES or rows % ROW_MULTIPLE or cols % 32:
        return None
    p = cq.repack(qt, raw, shape)
    if p.kind == "u4":
        u = p.qs.reshape(rows, cols // 32, 16)
        codes = np.concatenate((u & 15, u >> 4), axis=-1).reshape(rows, cols).astype(np.int8)  # 0..15
        if qt == QT.Q4_0:  # m = -8 d: signed codes, no offsets
            return AmxWeight(tiles(codes - np.int8(8), 32), by_tile_rows(p.d), np.zeros(1, np.float32), 32, False)
        return AmxWeight(tiles(codes, 32), by_tile_rows(p.d), by_tile_rows(p.m), 32, True)
    block = p.group  # 32, or 16 (Q6_K)
    return AmxWeight(tiles(p.qs, block), by_tile_rows(p.d), np.zeros(1, np.float32), block, False)


def dequantized(w: AmxWeight) -> np.ndarray:
    """The f32 matrix [rows, cols] that w holds (numpy, for tests): code * d (+ m)."""
    rt, nb, kq, n, c = w.codes.shape
    codes = w.codes.transpose(0, 3, 1, 2, 4).reshape(rt * n, nb, kq * c).astype(np.float32)  # [rows, block#, col]
    d = w.d.transpose(0, 2, 1).reshape(rt * n, nb, 1)
    values = codes * d
    if w.offsets:  # one offset per 32 columns
        m = w.m.transpose(0, 2, 1).reshape(rt * n, nb, 1)
        values = values + m
    out: np.ndarray = values.reshape(rt * n, nb * kq * c).astype(np.float32)
    return out
