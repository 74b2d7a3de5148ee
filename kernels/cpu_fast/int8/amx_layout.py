"""The weights of the AMX products (amx_ir.py) in their tile layout, made once at upload
from the file's blocks (cpu_quant.repack decodes the codes: the tested path).

A matrix follows its int8 view's float order (tests/int8_canonical.py, the spec; products.py's
kinds), so its tiles carry exactly the integers and scales that order names:

| kind | types | codes | K | d | m | sc | mn |
|------|-------|-------|---|---|---|----|----|
| u4 | Q4_0, Q4_1 | code (0..15) | 32 | d | m (Q4_0: -8 d) | - | - |
| p8 | Q8_0; Q5_0 (cols % 128 != 0) | signed code | 32 | d | - | - | - |
| u5 | Q5_0 (cols % 128 == 0) | code - 16 | 32 | d | - | - | - |
| k4 | Q4_K | code (0..15) | 32 | d per super-block | -dmin per super-block | sub-block scale | sub-block min |
| u6 | Q6_K | code - 32 | 16 | d per super-block | - | sub-block scale (int8) | - |

K is the columns of one tile product (a block, or a K-quant's sub-block). Every d and m is
the file's value in f32 (exact); code * d + m (K-quants: code * d * sc - dmin * mn) is the
oracle's value. Q4_0 keeps its unsigned codes and the offset -8 d, as its int8 view does,
so that its float steps are u4's. Q8_0 and Q5_0 whose cols are not a multiple of 64 have no
tiles (their int8 view is "i8", whose order the tiles do not implement), nor does Q4_0/Q4_1.

Layout (AmxWeight): codes [rows / 16, nblocks, K / 4, 16, 4] int8: per 16 weight rows and
block, one B tile of K / 4 rows of 64 bytes, byte 4n + c of tile row k = column 4k + c of the
block of weight row n (the VNNI layout tdpbssd reads). The scales put a block's 16 rows in
one vector: d and m [rows / 16, nblocks, 16] f32 (k4, u6: [rows / 16, nsuper, 16]); sc and
mn [rows / 16, nblocks, 16] int8. 8 bits a weight plus the scales: the int8 view (products.py)
stays beside it for the rounds of few rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.oracle.block_fields import f16, k4_scales_mins

ROW_MULTIPLE = 32  # weight rows of a kernel step (2 C tiles)
TYPES = (QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_0, QT.Q8_0, QT.Q6_K)
SUPER_KINDS = ("k4", "u6")  # activations rounded per 256 columns; the others per 32
_NONE_F32 = np.zeros(1, np.float32)
_NONE_I8 = np.zeros(1, np.int8)


class AmxWeight(NamedTuple):
    """A matrix [rows, cols] as the AMX kernels read it (the module docstring's layout)."""

    codes: np.ndarray  # [rows / 16, nblocks, K / 4, 16, 4] int8
    d: np.ndarray  # [rows / 16, nblocks, 16] f32 (k4, u6: per super-block)
    m: np.ndarray  # u4: offsets as d; k4: -dmin as d; else [1] f32 (unread)
    sc: np.ndarray  # k4, u6: sub-block scales [rows / 16, nblocks, 16] int8; else [1] (unread)
    mn: np.ndarray  # k4: sub-block mins as sc; else [1] (unread)
    kind: str  # "u4", "p8", "u5", "k4" or "u6": the float order (tests/int8_canonical.py)

    @property
    def block(self) -> int:
        """K: the columns of one tile product (16 for u6, else 32)."""
        return 16 if self.kind == "u6" else 32

    @property
    def group(self) -> int:
        """The columns that share one activation scale: 256 (k4, u6) or 32."""
        return 256 if self.kind in SUPER_KINDS else 32

    @property
    def nblocks(self) -> int:
        return int(self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.codes, self.d, self.m, self.sc, self.mn))


def kind_of(qt: QT, cols: int) -> str | None:
    """The tiles' kind of a matrix of type qt and width cols (its int8 view's), or None where
    the tiles do not take it (the "i8" view, or no int8 view)."""
    if qt == QT.Q4_K:
        return "k4"
    if qt == QT.Q6_K:
        return "u6"
    if cols % 64:
        return None
    if qt == QT.Q5_0 and cols % 128 == 0:
        return "u5"
    return "u4" if qt in (QT.Q4_0, QT.Q4_1) else "p8"


def tiles(codes: np.ndarray, block: int) -> np.ndarray:
    """codes [rows, cols] int8 -> [rows / 16, cols / block, block / 4, 16, 4]: B tiles (VNNI layout)."""
    rows, cols = codes.shape
    t = codes.reshape(rows // 16, 16, cols // block, block // 4, 4)  # [rt, n, b, k, c]
    out: np.ndarray = np.ascontiguousarray(t.transpose(0, 2, 3, 1, 4))
    return out


def by_tile_rows(values: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """values [rows, n] -> [rows / 16, n, 16] of dtype: the n-th value of 16 rows contiguous."""
    rows, n = values.shape
    out: np.ndarray = np.ascontiguousarray(values.reshape(rows // 16, 16, n).transpose(0, 2, 1)).astype(dtype)
    return out


def from_gguf(qt: QT, raw: np.ndarray, shape: tuple[int, int]) -> AmxWeight | None:
    """The tile layout of a matrix of a type of TYPES with rows % ROW_MULTIPLE == 0 whose
    kind_of is not None, else None (the int8 view's kernels take it)."""
    rows, cols = shape
    kind = kind_of(qt, cols) if qt in TYPES else None
    if kind is None or rows % ROW_MULTIPLE or cols % 32:
        return None
    p = cq.repack(qt, raw, shape)
    if kind in SUPER_KINDS:
        return _super_blocks(qt, raw, shape, p)
    if kind == "u4":
        u = p.qs.reshape(rows, cols // 32, 16)
        codes = np.concatenate((u & 15, u >> 4), axis=-1).reshape(rows, cols).astype(np.int8)  # 0..15
        return AmxWeight(tiles(codes, 32), by_tile_rows(p.d), by_tile_rows(p.m), _NONE_I8, _NONE_I8, kind)
    return AmxWeight(tiles(p.qs, 32), by_tile_rows(p.d), _NONE_F32, _NONE_I8, _NONE_I8, kind)


def _super_blocks(qt: QT, raw: np.ndarray, shape: tuple[int, int], p: cq.Packed) -> AmxWeight:
    """k4 (Q4_K) or u6 (Q6_K): codes from p, the super-blocks' d (and -dmin) and the
    sub-blocks' integer scales (and mins) from the file's blocks."""
    rows, cols = shape
    ns = cols // 256
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if qt == QT.Q6_K:
        blocks = b.reshape(rows * ns, 210)
        d = f16(blocks[:, 208:210])[:, 0].reshape(rows, ns)
        sc = blocks[:, 192:208].view(np.int8).reshape(rows, ns * 16)
        return AmxWeight(tiles(p.qs, 16), by_tile_rows(d), _NONE_F32, by_tile_rows(sc, np.int8), _NONE_I8, "u6")
    blocks = b.reshape(rows * ns, 144)
    d, dmin = (f16(blocks[:, i : i + 2])[:, 0].reshape(rows, ns) for i in (0, 2))
    sc, mn = (v.reshape(rows, ns * 8) for v in k4_scales_mins(blocks[:, 4:16]))  # 0..63 each
    u = p.qs.reshape(rows, cols // 32, 16)
    codes = np.concatenate((u & 15, u >> 4), axis=-1).reshape(rows, cols).astype(np.int8)  # 0..15
    return AmxWeight(tiles(codes, 32), by_tile_rows(d), by_tile_rows(-dmin), by_tile_rows(sc, np.int8),
                     by_tile_rows(mn, np.int8), "k4")


def dequantized(w: AmxWeight) -> np.ndarray:
    """The f32 matrix [rows, cols] that w holds (numpy, for tests): code * d (+ m) per block;
    K-quants: code * (d * sc) (- dmin * mn), the sub-block's scale and offset rounded to f32
    as the file's readers do."""
    rt, nb, kq, n, c = w.codes.shape
    codes = w.codes.transpose(0, 3, 1, 2, 4).reshape(rt * n, nb, kq * c).astype(np.float32)  # [rows, block#, col]
    per_super = 256 // w.block if w.kind in SUPER_KINDS else 1

    def rows_of(v: np.ndarray) -> np.ndarray:  # [rt, k, 16] -> [rows, nb, 1], each value over its blocks
        return np.repeat(v.transpose(0, 2, 1).reshape(rt * n, -1), nb // v.shape[1], axis=1)[..., None]

    d = rows_of(w.d)
    if per_super > 1:
        d = (d * rows_of(w.sc).astype(np.float32)).astype(np.float32)
    values = codes * d
    if w.kind == "u4":
        values = values + rows_of(w.m)
    elif w.kind == "k4":
        values = values + (rows_of(w.m) * rows_of(w.mn).astype(np.float32)).astype(np.float32)
    out: np.ndarray = values.reshape(rt * n, nb * kq * c).astype(np.float32)
    return out
