"""The int8 weight layouts of products.py's table, written and read back: u5 from Q5_0,
k4 from Q4_K and u6 from Q6_K (`*_from_*`, applied CHUNK_ROWS rows at a time by `by_rows`),
and every layout's rows as f32 (`dequantize_rows_*`: embedding lookups of a table kept only
in this form, bit for bit as oracle.quants.dequantize gives them).

u5's and u6's high bits sit beside their step's nibbles so that one stream holds them. The
kernels spread them to the bytes of their 32-byte code vectors with one shift per 64-bit
lane and one mask (AVX2's vpsrlvq, vpsllvq), on AVX2 as on AVX-512: u5's bit of byte k lies
in byte k % 8 at a position set by k // 8 (the 64-bit lane), u6's two in byte k % 16 at a
position set by k // 16 (the 128-bit half); as 32-bit planes they would cost AVX2 five
instructions each.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import prange

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.kernels.cpu_fast.cpu_ops import as_f32
from zinfer.kernels.cpu_fast.int8.ir_scales import K4_SUPER_BYTES, U6_SUPER_BYTES
from zinfer.kernels.oracle.block_fields import k4_scales_mins

U5_STEP_BYTES = 40  # per 64 columns
U6_STEP_BYTES = 48  # per 64 columns


Converter = Callable[[np.ndarray, tuple[int, int]], tuple[np.ndarray, ...]]  # (raw rows, their shape) -> arrays
CHUNK_ROWS = 1024  # rows converted at a time: the conversions' temporaries (~5 bytes a weight) stay small


def by_rows(convert: Converter, raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """convert(raw rows, their shape) -> arrays [rows, ...], applied CHUNK_ROWS rows at a
    time into arrays allocated once: a large matrix (an embedding table) never holds a
    conversion's temporaries for all its rows at once."""
    rows, cols = shape
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(rows, -1)  # [rows, row bytes]
    outs: tuple[np.ndarray, ...] = ()
    for r in range(0, rows, CHUNK_ROWS):
        parts = convert(b[r : r + CHUNK_ROWS], (min(CHUNK_ROWS, rows - r), cols))
        if not outs:
            outs = tuple(np.empty((rows, *a.shape[1:]), a.dtype) for a in parts)
        for out, a in zip(outs, parts):
            out[r : r + a.shape[0]] = a
    return outs


def _bit4s(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Two vectors of codes [..., 32] uint8 (below 32) -> [..., 8]: byte j holds bit 4 of
    low[8l + j] at bit l and of high[8l + j] at bit 4 + l."""
    lo = ((low >> 4) & 1).reshape(*low.shape[:-1], 4, 8)  # [..., l, j]
    hi = ((high >> 4) & 1).reshape(*high.shape[:-1], 4, 8)
    bits = (lo[..., 0, :] << 0) | (hi[..., 0, :] << 4)
    for l in range(1, 4):
        bits = bits + ((lo[..., l, :] << l) | (hi[..., l, :] << (4 + l)))
    packed: np.ndarray = bits.astype(np.uint8)
    return packed


def _high_pairs(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Two vectors of codes [..., 32] uint8 (below 64) -> [..., 16]: byte j holds bits 4-5
    of low[j], low[16 + j], high[j] and high[16 + j] at bits 0-1, 2-3, 4-5 and 6-7."""
    low_pairs = (low[..., :16] >> 4) | ((low[..., 16:] >> 4) << 2)
    pairs = low_pairs | ((high[..., :16] >> 4) << 4) | ((high[..., 16:] >> 4) << 6)
    packed: np.ndarray = pairs.astype(np.uint8)
    return packed


# U5_COLUMNS[p]: the column of a group of 128 (4 blocks, 2 steps) whose code (and
# activation) sits at position p = 32v + k: vector v (step v // 2's low, v even, or high
# nibbles), byte k, in block k // 8
U5_COLUMNS = np.array([32 * (k // 8) + 8 * v + k % 8 for v in range(4) for k in range(32)])


def u5_from_q5_0(raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Raw Q5_0 bytes of a [rows, cols] matrix (cols % 128 == 0) -> (qs [rows, cols/64 * 40]
    uint8, d [rows, cols/32] f16): the u5 layout."""
    rows, cols = shape
    p = cq.repack(QT.Q5_0, raw, shape)  # codes - 16 as int8, decoded once by the tested path
    codes = (p.qs.view(np.uint8) + np.uint8(16)).reshape(rows, cols // 128, 128)[..., U5_COLUMNS]
    vectors = codes.reshape(rows, cols // 64, 2, 32)  # [row, step, low/high, byte]
    low_vector, high_vector = vectors[..., 0, :], vectors[..., 1, :]
    nibbles = (low_vector & 15) | ((high_vector & 15) << 4)
    qs = np.concatenate((nibbles, _bit4s(low_vector, high_vector)), axis=-1).reshape(rows, -1)
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, 22)
    return qs, np.ascontiguousarray(b[:, 0:2]).view(np.float16).reshape(rows, cols // 32)


# K4_COLUMNS[p]: the column of a super-block whose code (and activation) sits at position
# p = 64j + 32h + 4b + r of the k4 order: step j, low (h = 0) or high nibble, block b
K4_COLUMNS = np.array(
    [32 * b + 8 * j + 4 * h + r for j in range(4) for h in range(2) for b in range(8) for r in range(4)]
)


def k4_from_q4_k(raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Raw Q4_K bytes of a [rows, cols] matrix -> (qs [rows, cols/2] uint8 in the k4 order,
    D [rows, cols/256 * 20] uint8: per super-block f16 d, f16 dmin, 8 scales, 8 mins): the
    k4 layout."""
    rows, cols = shape
    u4 = cq.repack(QT.Q4_K, raw, shape).qs.reshape(rows, cols // 32, 16)  # decoded once by the tested path
    codes = np.concatenate((u4 & 15, u4 >> 4), axis=-1).reshape(rows, cols // 256, 256)[..., K4_COLUMNS]
    nibbles = codes.reshape(rows, cols // 256, 4, 2, 32)  # [row, super-block, step, low/high, byte]
    qs = (nibbles[..., 0, :] | (nibbles[..., 1, :] << 4)).reshape(rows, cols // 2)
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, 144)
    sc, mn = k4_scales_mins(b[:, 4:16])  # [n, 8] each
    return qs, np.concatenate((b[:, 0:4], sc, mn), axis=1).reshape(rows, -1)


U6_LOW = np.array([16 * (k // 8) + k % 8 for k in range(32)])  # the column of a step of byte k of its low vector
U6_HIGH = U6_LOW + 8  # and of its high vector: the same 16-column group


def u6_from_q6_k(raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Raw Q6_K bytes of a [rows, cols] matrix -> (qs [rows, cols/64 * 48] uint8, D [rows,
    cols/256 * 18] uint8: per super-block the f16 d, then the 16 int8 scales): the u6 layout."""
    rows, cols = shape
    p = cq.repack(QT.Q6_K, raw, shape)  # codes - 32 as int8
    codes = (p.qs.view(np.uint8) + np.uint8(32)).reshape(rows, cols // 64, 64)  # [row, step, column]
    low, high = codes[..., U6_LOW], codes[..., U6_HIGH]  # [row, step, 32] each
    nibbles = (low & 15) | ((high & 15) << 4)
    qs = np.concatenate((nibbles, _high_pairs(low, high)), axis=-1).reshape(rows, -1)
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, 210)
    return qs, np.concatenate((b[:, 208:210], b[:, 192:208]), axis=1).reshape(rows, -1)


@cached_njit(parallel=True, nogil=True)
def dequantize_rows_u5(qs: np.ndarray, d: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[j] = f32 row rows[j] of a u5 matrix. qs [R, steps * 40] uint8, d [R, steps * 2]
    f16 bits as uint16, out [n, steps * 64]."""
    steps = d.shape[1] // 2
    for j in prange(rows.shape[0]):
        q, dr, o = qs[rows[j]], d[rows[j]], out[j]
        for s in range(steps):
            base, group = s * U5_STEP_BYTES, s // 2
            for k in range(32):  # the byte of both vectors: block 4 * group + k // 8
                byte, bits = np.int64(q[base + k]), np.int64(q[base + 32 + k % 8]) >> (k // 8)
                scale = as_f32(dr[4 * group + k // 8])
                column = 128 * group + 32 * (k // 8) + 8 * (2 * (s % 2)) + k % 8  # of the low vector; the high: 8 on
                o[column] = np.float32(((byte & 15) | ((bits & 1) << 4)) - 16) * scale
                o[column + 8] = np.float32(((byte >> 4) | (((bits >> 4) & 1) << 4)) - 16) * scale


@cached_njit(parallel=True, nogil=True)
def dequantize_rows_u6(qs: np.ndarray, sup: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[j] = f32 row rows[j] of a u6 matrix: (code - 32) * (d * scale) per 16 columns,
    as oracle.quants. qs [R, steps * 48] uint8, sup [R, steps / 4 * 18] uint8, out [n, steps * 64]."""
    steps = qs.shape[1] // U6_STEP_BYTES
    for j in prange(rows.shape[0]):
        q, dr, o = qs[rows[j]], sup[rows[j]], out[j]
        for s in range(steps):
            base, at = s * U6_STEP_BYTES, (s // 4) * U6_SUPER_BYTES
            d = as_f32(np.uint16(np.int64(dr[at]) | (np.int64(dr[at + 1]) << 8)))  # f16 bits, little-endian
            for k in range(32):  # byte k of the low and high vectors
                byte, bits = np.int64(q[base + k]), np.int64(q[base + 32 + k % 16])
                for v in range(2):  # v = 1: the high vector, 8 columns on
                    col = 16 * (k // 8) + k % 8 + 8 * v
                    code = ((byte >> (4 * v)) & 15) | (((bits >> (4 * v + 2 * (k // 16))) & 3) << 4)
                    scale = d * np.float32(np.int8(dr[at + 2 + (s % 4) * 4 + col // 16]))  # exact in f32
                    o[s * 64 + col] = np.float32(code - 32) * scale


@cached_njit(parallel=True, nogil=True)
def dequantize_rows_p8(qs: np.ndarray, d: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[j] = f32 row rows[j] of a p8 matrix. qs [R, steps * 64] int8 in the u4 step order
    ([block0 0..15, block1 0..15, block0 16..31, block1 16..31]), d [R, steps * 2] f32 or
    f16 bits as uint16, out [n, steps * 64]."""
    steps = d.shape[1] // 2
    for j in prange(rows.shape[0]):
        q, dr, o = qs[rows[j]], d[rows[j]], out[j]
        for s in range(steps):
            for blk in range(2):
                scale = as_f32(dr[2 * s + blk])
                for i in range(16):
                    o[s * 64 + blk * 32 + i] = np.float32(q[s * 64 + blk * 16 + i]) * scale
                    o[s * 64 + blk * 32 + 16 + i] = np.float32(q[s * 64 + 32 + blk * 16 + i]) * scale


@cached_njit(parallel=True, nogil=True)
def dequantize_rows_u4(qs: np.ndarray, d: np.ndarray, m: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[j] = f32 row rows[j] of a u4 matrix: code * d + m per 32-block (the product is
    exact, so one rounding, as oracle.quants). qs [R, blocks * 16] uint8 (byte i of a
    block: codes i and i + 16), d, m [R, blocks] f32 or f16 bits as uint16, out [n, blocks * 32]."""
    blocks = qs.shape[1] // 16
    for j in prange(rows.shape[0]):
        q, dr, mr, o = qs[rows[j]], d[rows[j]], m[rows[j]], out[j]
        for b in range(blocks):
            scale, offset = as_f32(dr[b]), as_f32(mr[b])
            for i in range(16):
                byte = np.int64(q[b * 16 + i])
                o[b * 32 + i] = np.float32(byte & 15) * scale + offset
                o[b * 32 + 16 + i] = np.float32(byte >> 4) * scale + offset


@cached_njit(parallel=True, nogil=True)
def dequantize_rows_i8(qs: np.ndarray, d: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[j] = f32 row rows[j] of an i8 matrix. qs [R, cols] int8, d [R, cols / group] f32
    or f16 bits as uint16, out [n, cols]."""
    group = qs.shape[1] // d.shape[1]
    for j in prange(rows.shape[0]):
        q, dr, o = qs[rows[j]], d[rows[j]], out[j]
        for k in range(qs.shape[1]):
            o[k] = np.float32(q[k]) * as_f32(dr[k // group])


@cached_njit(parallel=True, nogil=True)
def dequantize_rows_k4(qs: np.ndarray, sup: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[j] = f32 row rows[j] of a k4 matrix: code * (d * scale) - dmin * min per 32-block,
    as oracle.quants. qs [R, cols / 2] uint8 (the k4 order), sup [R, cols / 256 * 20] uint8, out [n, cols]."""
    blocks = qs.shape[1] // 16
    for j in prange(rows.shape[0]):
        q, dr, o = qs[rows[j]], sup[rows[j]], out[j]
        for b in range(blocks):
            at = (b // 8) * K4_SUPER_BYTES
            d = as_f32(np.uint16(np.int64(dr[at]) | (np.int64(dr[at + 1]) << 8)))  # f16 bits, little-endian
            dmin = as_f32(np.uint16(np.int64(dr[at + 2]) | (np.int64(dr[at + 3]) << 8)))
            scale, offset = d * np.float32(dr[at + 4 + b % 8]), dmin * np.float32(dr[at + 12 + b % 8])
            first = (b // 8) * 128 + 4 * (b % 8)  # the block's bytes in step 0 of its super-block
            for c in range(32):  # column 8 * step + 4 * nibble + r
                byte = np.int64(q[first + 32 * (c // 8) + c % 4])
                o[b * 32 + c] = np.float32((byte >> (4 * ((c // 4) % 2))) & 15) * scale - offset
