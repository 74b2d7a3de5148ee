"""The weight layouts cpu-fast's int8 kernels read: Q5_0, Q4_K and Q6_K at the file's width
(u5: kernels/int8_ir.py; k4, u6: kernels/int8_ir_super.py), and p8, u4, i8.

The codes are stored unsigned (Q5_0: 0..31, value (code - 16) * d; Q6_K: 0..63,
value (code - 32) * d * scale): their low 4 bits as nibbles, their high bits in 8 (u5) or
16 (u6) bytes per step next to the nibbles of the same step, so that one stream holds
them. The kernel spreads them to the bytes of its 32-byte code vectors with one shift
per 64-bit lane and one mask (AVX2's vpsrlvq, vpsllvq), on AVX2 as on AVX-512: u5's
bit of byte k lies in byte k % 8 at a position set by k // 8 (the 64-bit lane), u6's
two in byte k % 16 at a position set by k // 16 (the 128-bit half). As 32-bit planes
they cost AVX2 five instructions each.

- u5, per 64 columns (a step, 40 bytes): 32 nibble bytes, byte k holding the codes of the
  step's low and high vectors' byte k, then bit 4 of those codes in 8 bytes: byte j
  holds, of byte 8l + j of each vector (l = 0..3), the low vector's bit at bit l and the
  high vector's at bit 4 + l. Steps pair into groups of 128 columns (4 blocks) whose 4
  vectors hold in bytes 8b..8b + 7 columns of block b (U5_COLUMNS), for
  kernels/int8_ir_blocks.py. d: GGUF's f16 scales, [rows, cols / 32].
- k4 (Q4_K), per 256 columns (a super-block, 128 bytes): 4 steps of 32 bytes; byte 4b + r
  of step j holds, low nibble, the code of column 32b + 8j + r and, high nibble, that of
  32b + 8j + 4 + r (K4_COLUMNS), so every byte's two codes lie in 32-block b whatever the
  step: the kernel's int16 pair sums keep one block per lane over the whole super-block
  and take its scales in one vpmaddwd (kernels/int8_ir_super.py). D per 256 columns (20
  bytes): the file's f16 d and dmin, then its 8 6-bit scales and 8 mins as bytes.
- u6, per 64 columns (48 bytes), in an order of its own: a low and a high vector of 32
  codes that share their 16-column groups (byte k of the low vector: column 16 * (k // 8)
  + k % 8 of the step; of the high one: 8 columns on), their low nibbles in 32 bytes (byte
  k: the low vector's code k, the high one's above it), then their high two bits in 16
  bytes: byte j holds those of the low vector's codes j and 16 + j and of the high
  vector's j and 16 + j, at bits 0-1, 2-3, 4-5, 6-7. D per 256 columns (18 bytes): the
  file's f16 d, then its 16 int8 scales.

`dequantize_rows_*` give the f32 rows bit for bit as kernels.quants.dequantize does
(embedding lookups of a table kept only in this form), for these two and for the other
int8 layouts, which cpu-fast keeps alone too: p8 (Q8_0's int8 codes in the u4 step order),
u4 (nibbles with f16 or f32 d and m per 32) and i8 (int8 codes, d per 16 or 32).
"""

from __future__ import annotations

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


CHUNK_ROWS = 1024  # rows converted at a time: the conversions' temporaries (~5 bytes a weight) stay small


def by_rows(convert, raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, ...]:
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
    return sum((lo[..., l, :] << l) | (hi[..., l, :] << (4 + l)) for l in range(4)).astype(np.uint8)


def _high_pairs(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Two vectors of codes [..., 32] uint8 (below 64) -> [..., 16]: byte j holds bits 4-5
    of low[j], low[16 + j], high[j] and high[16 + j] at bits 0-1, 2-3, 4-5 and 6-7."""
    return ((low[..., :16] >> 4) | ((low[..., 16:] >> 4) << 2) | ((high[..., :16] >> 4) << 4) | ((high[..., 16:] >> 4) << 6)).astype(np.uint8)


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
K4_COLUMNS = np.array([32 * b + 8 * j + 4 * h + r for j in range(4) for h in range(2) for b in range(8) for r in range(4)])


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
def dequantize_rows_u5(qs, d, rows, out):
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
def dequantize_rows_u6(qs, sup, rows, out):
    """out[j] = f32 row rows[j] of a u6 matrix: (code - 32) * (d * scale) per 16 columns,
    as kernels.quants. qs [R, steps * 48] uint8, sup [R, steps / 4 * 18] uint8, out [n, steps * 64]."""
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
def dequantize_rows_p8(qs, d, rows, out):
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
def dequantize_rows_u4(qs, d, m, rows, out):
    """out[j] = f32 row rows[j] of a u4 matrix: code * d + m per 32-block (the product is
    exact, so one rounding, as kernels.quants). qs [R, blocks * 16] uint8 (byte i of a
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
def dequantize_rows_i8(qs, d, rows, out):
    """out[j] = f32 row rows[j] of an i8 matrix. qs [R, cols] int8, d [R, cols / group] f32
    or f16 bits as uint16, out [n, cols]."""
    group = qs.shape[1] // d.shape[1]
    for j in prange(rows.shape[0]):
        q, dr, o = qs[rows[j]], d[rows[j]], out[j]
        for k in range(qs.shape[1]):
            o[k] = np.float32(q[k]) * as_f32(dr[k // group])


@cached_njit(parallel=True, nogil=True)
def dequantize_rows_k4(qs, sup, rows, out):
    """out[j] = f32 row rows[j] of a k4 matrix: code * (d * scale) - dmin * min per 32-block,
    as kernels.quants. qs [R, cols / 2] uint8 (the k4 order), sup [R, cols / 256 * 20] uint8, out [n, cols]."""
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
