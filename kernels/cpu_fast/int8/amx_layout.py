"""The weights of the AMX products (amx_ir.py, amx_ir_folded.py) in their tile layout, made
once at upload from the file's blocks (cpu_quant.repack decodes the codes: the tested path).

A matrix follows its int8 view's float order (tests/int8_canonical.py, the spec; products.py's
kinds), so its tiles carry exactly the integers and scales that order names:

| kind | types | codes (lo) | K | d | m | sc | mn |
|------|-------|------------|---|---|---|----|----|
| u4 | Q4_0, Q4_1 | code (0..15) | 32 | d | m (Q4_0: -8 d) | - | - |
| p8 | Q8_0; Q5_0 (cols % 128 != 0) | signed code | 32 | d | - | - | - |
| u5 | Q5_0 (cols % 128 == 0) | code - 16 | 32 | d | - | - | - |
| k4 | Q4_K | hi, lo of sc * code | 64 | d per super-block | -dmin per super-block | sub-block scale | mins |
| u6 | Q6_K | hi, lo of sc * (code - 32) | 64 | d per super-block | - | sub-block scale | - |

K is the columns of one tile product. Every d and m is the file's value in f32 (exact); code
* d + m (K-quants: code * d * sc - dmin * mn) is the oracle's value. Q4_0 keeps its unsigned
codes and the offset -8 d, as its int8 view does, so that its float steps are u4's. Q8_0 and
Q5_0 whose cols are not a multiple of 64 have no tiles (their int8 view is "i8", whose order
the tiles do not implement), nor does Q4_0/Q4_1.

The K-quants are folded: each weight's integer w = sc_j * code (Q6_K: -4096..4064, Q4_K:
0..945) is split w = 64 hi + lo with lo in 0..63 (hi: -64..64, 0..14), both int8, so a
super-block's integer sum Isum = sum over j of sc_j * (codes . activations)_j, which the
order names, is 64 H + L of two tile products over its 256 columns: exact, the same integer,
and one float step per super-block instead of one per sub-block (2 bytes a weight).

Layout (AmxWeight): codes (and lo) [rows / 16, cols / K, K / 4, 16, 4] int8: per 16 weight
rows and block, one B tile of K / 4 rows of 64 bytes, byte 4n + c of tile row k = column
4k + c of the block of weight row n (the VNNI layout tdpbssd reads). The scales put a block's
16 rows in one vector: d and m [rows / 16, nblocks, 16] f32 (k4, u6: [rows / 16, nsuper,
16]); sc [rows / 16, nsub, 16] int8 (kept for `dequantized`; the kernels read the folded
codes); k4's mn the B tiles of its 8 mins per super-block, [rows / 16, nsuper, 2, 16, 4]
int8 and 1 KiB of zeros, flat (min_tiles). Tiles are 64-byte aligned (aligned_empty). The
int8 view (products.py) stays beside it for the rounds of few rows.
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

    codes: np.ndarray  # [rows / 16, nblocks, K / 4, 16, 4] int8 (k4, u6: hi)
    lo: np.ndarray  # k4, u6: lo as codes; else [1] (unread)
    d: np.ndarray  # [rows / 16, nblocks, 16] f32 (k4, u6: per super-block)
    m: np.ndarray  # u4: offsets as d; k4: -dmin as d; else [1] f32 (unread)
    sc: np.ndarray  # k4, u6: sub-block scales [rows / 16, nsub, 16] int8; else [1] (unread)
    mn: np.ndarray  # k4: sub-block mins, flat B tiles (min_tiles); else [1] (unread)
    kind: str  # "u4", "p8", "u5", "k4" or "u6": the float order (tests/int8_canonical.py)

    @property
    def block(self) -> int:
        """K: the columns of one tile product (64 for the folded k4 and u6, else 32)."""
        return 64 if self.kind in SUPER_KINDS else 32

    @property
    def group(self) -> int:
        """The columns that share one activation scale: 256 (k4, u6) or 32."""
        return 256 if self.kind in SUPER_KINDS else 32

    @property
    def nblocks(self) -> int:
        return int(self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """Every array held."""
        return (self.codes, self.lo, self.d, self.m, self.sc, self.mn)


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


def aligned_empty(shape: tuple[int, ...], dtype: type, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of `align` bytes:
    a tile row of 64 bytes that straddles two cache lines loads at about half speed."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + align, np.uint8)
    start = -raw.ctypes.data % align
    out: np.ndarray = raw[start : start + size].view(dtype).reshape(shape)
    return out


def tiles(codes: np.ndarray, block: int) -> np.ndarray:
    """codes [rows, cols] int8 -> [rows / 16, cols / block, block / 4, 16, 4]: B tiles (VNNI
    layout), 64-byte aligned."""
    rows, cols = codes.shape
    t = codes.reshape(rows // 16, 16, cols // block, block // 4, 4)  # [rt, n, b, k, c]
    out = aligned_empty((rows // 16, cols // block, block // 4, 16, 4), np.int8)
    out[:] = t.transpose(0, 2, 3, 1, 4)
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
        return AmxWeight(tiles(codes, 32), _NONE_I8, by_tile_rows(p.d), by_tile_rows(p.m), _NONE_I8, _NONE_I8, kind)
    return AmxWeight(tiles(p.qs, 32), _NONE_I8, by_tile_rows(p.d), _NONE_F32, _NONE_I8, _NONE_I8, kind)


def _super_blocks(qt: QT, raw: np.ndarray, shape: tuple[int, int], p: cq.Packed) -> AmxWeight:
    """k4 (Q4_K) or u6 (Q6_K): the folded codes of p's codes and the file's sub-block scales,
    the super-blocks' d (and -dmin) and k4's mins in B tiles."""
    rows, cols = shape
    ns = cols // 256
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if qt == QT.Q6_K:
        blocks = b.reshape(rows * ns, 210)
        d = f16(blocks[:, 208:210])[:, 0].reshape(rows, ns)
        sc = blocks[:, 192:208].view(np.int8).reshape(rows, ns * 16)
        hi, lo = fold(p.qs, sc)
        return AmxWeight(tiles(hi, 64), tiles(lo, 64), by_tile_rows(d), _NONE_F32, by_tile_rows(sc, np.int8), _NONE_I8,
                         "u6")
    blocks = b.reshape(rows * ns, 144)
    d, dmin = (f16(blocks[:, i : i + 2])[:, 0].reshape(rows, ns) for i in (0, 2))
    sc, mn = (v.reshape(rows, ns * 8).astype(np.int8) for v in k4_scales_mins(blocks[:, 4:16]))  # 0..63 each
    u = p.qs.reshape(rows, cols // 32, 16)
    codes = np.concatenate((u & 15, u >> 4), axis=-1).reshape(rows, cols).astype(np.int8)  # 0..15
    hi, lo = fold(codes, sc)
    return AmxWeight(tiles(hi, 64), tiles(lo, 64), by_tile_rows(d), by_tile_rows(-dmin), by_tile_rows(sc, np.int8),
                     min_tiles(mn), "k4")


def min_tiles(mn: np.ndarray) -> np.ndarray:
    """k4's mins mn [rows, nsuper * 8] int8 -> flat int8: their B tiles [rows / 16, nsuper, 2,
    16, 4], then 1 KiB of zeros: the kernel reads each as a 16-row tile, whose rows past the
    2 of the mins its activations' zeros multiply, so it reads up to 896 bytes past the last."""
    t = tiles(mn, 8)
    out = aligned_empty((t.size + 1024,), np.int8)
    out[: t.size] = t.reshape(-1)
    out[t.size :] = 0
    return out


def fold(codes: np.ndarray, sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """codes [rows, cols] int8 and sub-block scales sc [rows, nsub] int8 -> (hi, lo) [rows,
    cols] int8 with 64 hi + lo = sc_j * code for each code of sub-block j, lo in 0..63."""
    w = codes.astype(np.int32) * np.repeat(sc.astype(np.int32), codes.shape[1] // sc.shape[1], axis=1)
    hi = w >> 6  # floor division: lo = w - 64 hi is in 0..63
    assert hi.min(initial=0) >= -128 and hi.max(initial=0) <= 127
    return hi.astype(np.int8), (w & 63).astype(np.int8)


def untiled(t: np.ndarray) -> np.ndarray:
    """tiles' inverse: [rows / 16, nblocks, K / 4, 16, 4] -> [rows, cols] of the same dtype."""
    rt, nb, kq, n, c = t.shape
    out: np.ndarray = t.transpose(0, 3, 1, 2, 4).reshape(rt * n, nb * kq * c)
    return out


def dequantized(w: AmxWeight) -> np.ndarray:
    """The f32 matrix [rows, cols] that w holds (numpy, for tests): code * d (+ m) per block;
    K-quants: code * (d * sc) (- dmin * mn), the sub-block's scale and offset rounded to f32
    as the file's readers do, each code recovered from its folded integer 64 hi + lo."""

    def by_rows(v: np.ndarray, width: int) -> np.ndarray:  # [rows / 16, k, 16] -> [rows, width], each value repeated
        rows_k = v.transpose(0, 2, 1).reshape(-1, v.shape[1])
        return np.repeat(rows_k, width // v.shape[1], axis=1)

    if w.kind not in SUPER_KINDS:
        codes = untiled(w.codes).astype(np.float32)
        values = codes * by_rows(w.d, codes.shape[1])
        out: np.ndarray = values + by_rows(w.m, codes.shape[1]) if w.kind == "u4" else values
        return out
    folded = 64 * untiled(w.codes).astype(np.int32) + untiled(w.lo)
    cols, nsub = folded.shape[1], w.sc.shape[1]
    sc = by_rows(w.sc, cols).astype(np.int32)
    codes = np.where(sc != 0, folded // np.where(sc == 0, 1, sc), 0).astype(np.float32)
    step = (by_rows(w.d, nsub) * by_rows(w.sc, nsub).astype(np.float32)).astype(np.float32)  # [rows, nsub]
    values = codes * np.repeat(step, cols // nsub, axis=1)
    if w.kind == "k4":
        mn = w.mn[:-1024].reshape(w.sc.shape[0], nsub // 8, 2, 16, 4)
        mins = (by_rows(w.m, nsub) * untiled(mn).astype(np.float32)).astype(np.float32)  # [rows, nsub]
        values = values + np.repeat(mins, cols // nsub, axis=1)
    return values.astype(np.float32)
