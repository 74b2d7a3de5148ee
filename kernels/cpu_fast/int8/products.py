"""cpu-fast's quantized products with int8 activations (VNNI vpdpbusd, or AVX2's vpmaddubsw):
the entry point of kernels/cpu_fast/int8/, and its one table of the weight layouts.

llama.cpp's recipe: round each group of activations to int8 with a float scale (d_a =
amax / 127, kept in f32), multiply by the integer weight codes exactly, apply the scales in
float. `from_gguf` reads a Q5_0, Q4_K or Q6_K matrix from the file's blocks at about their
own width; `prepare` takes any other matrix from its cpu_quant repack (Packed u4 or i8).
`matmul` / `matmul_many` compute out [T, rows] = x [T, cols] @ W.T in one parallel launch
(row_driver.run_jobs): row kernels (ir.py, ir_blocks.py, ir_super.py) tile by tile, or, for a task of
OUTER_MIN_ROWS (32) activation rows or more of u5, k4 and u6, outer products (ir_outer.py,
from a scratch ir_convert.py fills). Where the CPU has AMX-INT8 and the process may use
its tiles (amx_host.py), a matrix may also carry its tile layout (Int8Weight.amx,
amx_layout.py, made at upload), and a launch of amx_products.MIN_ROWS rows or more whose
matrices all carry one runs on the tiles (amx_products.py) instead. Without VNNI or AVX2
(`available()` False) the device uses cpu_quant's float kernels instead.

Weight type -> int8 layout. Step: the kernels' unit of columns (8 int32 lanes). Bytes: of
codes per step and weight row. D: the scales the kernels read; "f16 if exact": f16 where
every scale survives the trip, else f32. Order: how activations are laid out for it (below).
Round: columns per activation scale. Kernels: row / prefill. Bits: per weight with scales.

| type | layout | when | step | bytes | D | order | round | kernels | bits |
|------|--------|------|------|-------|---|-------|-------|---------|------|
| Q4_0, Q4_1 | u4 | cols % 64 == 0 | 64 | 32 | d, m per 32 (f16 if exact) | u4 | 32 | ir.py | 5 |
| Q8_0 | p8 | cols % 64 == 0 | 64 | 64 | d per 32 (f16) | u4 | 32 | ir.py | 8.5 |
| Q8_0 | i8 | cols % 32 == 0 | 32 | 32 | d per 32 (f16) | plain | 32 | ir.py | 8.5 |
| Q5_0 | u5 | cols % 128 == 0 | 64 | 40 | the file's f16 d per 32 | u5 | 32 | ir_blocks / outer | 5.5 |
| Q5_0 | p8, i8 | else, as Q8_0 | | | d per 32 (f16) | | 32 | ir.py | 8.5 |
| Q4_K | k4 | always | 64 | 32 | 20 bytes per 256 | k4 | 256 | ir_super / outer | 4.625 |
| Q6_K | u6 | always | 64 | 48 | 18 bytes per 256 | u6 | 256 | ir_super / outer | 6.5625 |

Every other type (F32, F16, BF16, Q5_1, Q2_K, Q3_K, Q5_K), and Q4_0 / Q4_1 of other widths,
has no int8 layout (the device multiplies it in float).

The bytes of a weight row, per step (k: a byte's index in a 32-byte vector):

- u4: two 32-blocks of cpu_quant's U4 nibbles (byte i of a block: code i, low nibble, and
  i + 16); value = code * d + m. M: m [rows + pad, cols / 32], zero rows past the last
  (the offsets loop reads whole vectors of 8 blocks).
- p8: Q8_0's int8 codes of two 32-blocks in the u4 order: [block0 0..15, block1 0..15,
  block0 16..31, block1 16..31]; two vpdpbusd fill the same lanes, half i8's float work.
- i8: 32 int8 codes; d one number a step (group 32) or two (group 16: cpu_quant's Q6_K,
  the float kernels' layout); vpdpbusd multiplies |w| by a * sign(w) (llama.cpp's trick).
- u5 (Q5_0, codes 0..31 = the file's plus 16): 32 nibble bytes (byte k: the low vector's
  code k, the high vector's above it), then 8 bytes of bit 4: byte j holds, of byte 8l + j
  of each vector (l = 0..3), the low vector's bit at bit l and the high's at bit 4 + l.
  Two steps make a group of 128 columns (4 blocks) whose 4 vectors hold in bytes 8b..8b + 7
  columns of block b (layouts.U5_COLUMNS), so a lane pair sums one block over the group.
- k4 (Q4_K): 4 steps per super-block of 256; byte 4b + r of step j holds, low nibble,
  column 32b + 8j + r and, high nibble, 32b + 8j + 4 + r (layouts.K4_COLUMNS): every byte
  lies in 32-block b whatever the step, so a lane sums one block over the super-block.
  D: the file's f16 d and dmin, its 8 6-bit scales and 8 mins as bytes.
- u6 (Q6_K, codes 0..63 = the file's plus 32): a low and a high vector sharing their
  16-column groups (byte k of the low: column 16 * (k // 8) + k % 8; of the high: 8 on,
  layouts.U6_LOW, U6_HIGH): 32 nibble bytes as u5's, then 16 bytes of bits 4-5: byte j
  holds those of the low vector's codes j and 16 + j and the high's j and 16 + j, at bits
  0-1, 2-3, 4-5, 6-7. D: the file's f16 d, then its 16 int8 scales.

u5's and u6's high bits sit beside the nibbles of their step (one stream); the kernels
spread them to their bytes with one shift per 64-bit lane and a mask (ir_scales.bit4s,
high_pairs). The codes' offset (16 or 32 times the activations) is taken off in integers,
from C, which the activations carry (it depends on them alone).

Activation orders (activations.py writes A [T, cols] int8 in them, with S [T, nsteps * 8]
f32, d_a per lane; N [T, nchunks * 8], d_a times each 32-block's code sum, for u4 and k4;
C, the code offsets, for u5 and u6): plain, column order; u4, per 64 columns as p8's bytes;
u5, k4 and u6, per group as their weights' columns. What a kernel reads is Int8Args (ir.py):
W, D, M the weights, A, S, N, C the activations.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.int8 import layouts as bp
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_layout, amx_products, ir, ir_super
from zinfer.kernels.cpu_fast.int8.amx_layout import AmxWeight
from zinfer.kernels.cpu_fast.cpu_ops import PARALLEL_ROWS, specialize
from zinfer.kernels.cpu_fast.cpu_quant import Packed
from zinfer.kernels.cpu_fast.int8.activations import (
    K4_ORDER,
    ORDER_NAMES,
    ORDERS,
    PLAIN,
    QUANTIZERS,
    U4_ORDER,
    U5_ORDER,
    U6_ORDER,
)
from zinfer.kernels.cpu_fast.int8.row_driver import job_row, run_jobs
from zinfer.kernels.cpu_fast.numba_types import Int


class Int8Weight(NamedTuple):
    """A packed matrix as the int8 kernels read it."""

    kind: str  # "u4", "p8", "i8", "u5", "u6" or "k4" (the layout table above)
    dps: int  # d numbers per 8-lane step
    half: bool  # d and m stored as f16 (exactly: GGUF's own scales), else f32
    qs: np.ndarray  # [rows, cols/2] uint8 (u4, k4), [rows, cols] int8 (p8, i8), [rows, steps * bytes] uint8 (u5, u6)
    d: np.ndarray  # [rows, groups] scales (k4, u6: [rows, cols/256 * 20 or 18] bytes, the super-blocks' scales)
    m: np.ndarray  # [rows + pad, blocks] u4 offsets, zero rows after the last (read 8 past it); others: d (not read)
    nsteps: int  # 8-lane steps per row
    amx: AmxWeight | None = None  # the same matrix in AMX tiles (amx_layout.py), for rounds of many rows

    @property
    def nchunks(self) -> int:
        """Vectors of 8 blocks' offsets per row (u4)."""
        return -(-self.nsteps * 2 // 8)

    @property
    def nbytes(self) -> int:
        """The bytes one product streams."""
        offsets = self.m[: self.qs.shape[0]].nbytes if self.kind == "u4" else 0  # u4: not its pad rows
        return self.qs.nbytes + self.d.nbytes + offsets


def available() -> bool:
    """Whether the int8 kernels run on this machine (VNNI or AVX2, and llvmlite compiles for it)."""
    return ir.available()


def _as_f16_if_exact(*arrays: np.ndarray) -> tuple[bool, list[np.ndarray]]:
    """The arrays in f16 when every value survives the trip, else unchanged."""
    halves = [a.astype(np.float16) for a in arrays]
    if all(np.array_equal(h.astype(np.float32), a) for h, a in zip(halves, arrays)):
        return True, halves
    return False, list(arrays)


def from_gguf(qt: QT, raw: np.ndarray, shape: tuple[int, int]) -> Int8Weight | None:
    """The file's blocks of a Q5_0 (cols % 128 == 0), Q4_K or Q6_K matrix [rows, cols] read
    near their own width (u5: 5.5 bits per weight, k4: 4.625, u6: 6.5625, the file's), or None for
    other types and shapes (then `prepare` on cpu_quant's repack)."""
    rows, cols = shape
    if qt == QT.Q5_0 and cols % 128 == 0:
        qs, d = bp.by_rows(bp.u5_from_q5_0, raw, shape)
        return Int8Weight("u5", 2, True, qs, d, d, cols // 64)
    if qt == QT.Q4_K:
        qs, sup = bp.by_rows(bp.k4_from_q4_k, raw, shape)
        return Int8Weight("k4", 2, True, qs, sup, sup, cols // 64)
    if qt == QT.Q6_K and cols % 256 == 0:
        qs, sup = bp.by_rows(bp.u6_from_q6_k, raw, shape)
        return Int8Weight("u6", 2, True, qs, sup, sup, cols // 64)
    return None


def kernels_choice() -> str:
    """The int8 kernels this process is asked to use: "amx", "vnni" or "avx2" (amx_host.kernels_choice)."""
    return amx_host.kernels_choice()


def with_tiles(w: Int8Weight, qt: QT, raw: np.ndarray, shape: tuple[int, int]) -> Int8Weight:
    """w carrying its AMX tile layout too (from the file's blocks `raw`), where the int8
    kernels asked for are AMX's (amx_host.kernels_choice) and the type and shape have one;
    else w as it is."""
    if amx_host.kernels_choice() != "amx":
        return w
    tiles = amx_layout.from_gguf(qt, raw, shape)
    return w if tiles is None else w._replace(amx=tiles)


def dequantize_rows(w: Int8Weight, rows: np.ndarray, out: np.ndarray) -> None:
    """out [n, cols] = the f32 values of rows [n] int64 of w, as oracle.quants.dequantize gives them."""
    d, m = (w.d.view(np.uint16), w.m.view(np.uint16)) if w.half else (w.d, w.m)
    if w.kind == "u4":
        bp.dequantize_rows_u4(w.qs, d, m, rows, out)
    elif w.kind == "k4":  # D: bytes per super-block
        bp.dequantize_rows_k4(w.qs, w.d, rows, out)
    elif w.kind == "u6":
        bp.dequantize_rows_u6(w.qs, w.d, rows, out)
    else:
        by_kind = {"u5": bp.dequantize_rows_u5, "p8": bp.dequantize_rows_p8, "i8": bp.dequantize_rows_i8}
        by_kind[w.kind](w.qs, d, rows, out)


def prepare(p: Packed) -> Int8Weight | None:
    """The int8-kernel view of p, or None when its shape or layout has no kernel."""
    rows, cols = p.shape
    if p.kind == "u4" and cols % 64 == 0:
        half, (d, m) = _as_f16_if_exact(p.d, p.m)
        # The offsets loop reads whole vectors of 8, past the last row: zero rows after it,
        # inside the array itself, so a copy (the weight cache's pickle) keeps them.
        padded = np.zeros((rows + -(-8 // m.shape[1]), m.shape[1]), m.dtype)
        padded[:rows] = m
        return Int8Weight("u4", 2, half, p.qs, d, padded, cols // 64)
    if p.kind == "i8" and cols % 64 == 0 and p.group == 32:
        half, (d,) = _as_f16_if_exact(p.d)
        pairs = p.qs.reshape(rows, cols // 64, 2, 2, 16)  # [rows, pair, block, half, 16]
        qs = np.ascontiguousarray(pairs.transpose(0, 1, 3, 2, 4)).reshape(rows, cols)
        return Int8Weight("p8", 2, half, qs, d, d, cols // 64)
    if p.kind == "i8" and cols % 32 == 0 and p.group in (16, 32):
        half, (d,) = _as_f16_if_exact(p.d)
        return Int8Weight("i8", 32 // p.group, half, p.qs, d, d, cols // 32)
    return None


def rounded(x: np.ndarray, group: int = 32) -> np.ndarray:
    """x [T, cols] f32 as the int8 kernels see it: per `group` values (rounding_group's),
    codes rint(x * 127 / amax) times amax / 127 (numpy, the reference for tests)."""
    T, cols = x.shape
    xb = x.reshape(T, cols // group, group)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    values: np.ndarray = (np.rint(xb * inv) * (amax / np.float32(127))).astype(np.float32)
    return values.reshape(T, cols)


def rounding_group(w: Int8Weight) -> int:
    """The columns that share one activation scale for w's kernels: 256 for k4 and u6
    (a super-block: their sub-block scales apply as integers), else 32."""
    return 256 if w.kind in ir_super.KINDS else 32


def activation_order(w: Int8Weight) -> int:
    """The order w's kernels read activations in: plain (32 per step, i8), u4's (p8, u5
    and u4), k4's or u6's (layouts.py)."""
    orders = {"u6": U6_ORDER, "k4": K4_ORDER, "u5": U5_ORDER}
    return orders.get(w.kind, U4_ORDER if w.kind in ir.STEP64 else PLAIN)


def same_layout(a: Int8Weight, b: Int8Weight) -> bool:
    """Whether a and b read the same activation rounding (one matmul_many can do both,
    each matrix with its own layout's kernels)."""
    return (activation_order(a), a.nsteps, rounding_group(a)) == (activation_order(b), b.nsteps, rounding_group(b))


class Jobs(NamedTuple):
    """Matrices of one activation layout that one launch multiplies by the same activations."""

    weights: list[Int8Weight]
    table: np.ndarray  # [n, row_driver.JOB_COLUMNS] int64: a job row (row_driver.job_row) per matrix
    bounds: list[tuple[int, int]]  # each matrix's rows in the stacked output
    amx: np.ndarray | None = None  # amx_products' jobs, where every matrix has tiles and they run here

    @property
    def rows(self) -> int:
        return self.bounds[-1][1]


def jobs_for(ws: list[Int8Weight]) -> Jobs:
    """The jobs of matmul_many for matrices of one layout. Build them once per group:
    reading array addresses from Python costs microseconds."""
    assert all(same_layout(ws[0], w) for w in ws)
    first = np.cumsum([0] + [w.qs.shape[0] for w in ws])
    table = np.array([job_row(w, int(row)) for w, row in zip(ws, first)], np.int64)
    tiles = [w.amx for w in ws if w.amx is not None]
    amx = amx_products.job_table(tiles, [int(f) for f in first[:-1]]) if len(tiles) == len(ws) else None
    return Jobs(ws, table, [(int(a), int(b)) for a, b in zip(first[:-1], first[1:])], amx)


def matmul(w: Int8Weight, x: np.ndarray, out: np.ndarray) -> None:
    """out [T, rows] (C-contiguous) = x [T, cols] @ W.T."""
    assert out.flags.c_contiguous and out.shape == (x.shape[0], w.qs.shape[0])
    _launch(jobs_for([w]), x, out)


def matmul_many(jobs: Jobs, x: np.ndarray) -> list[np.ndarray]:
    """[x [T, cols] @ W.T for each of the jobs' matrices], C-contiguous [T, rows_i] arrays
    in one buffer, from one rounding of x and one parallel launch over all their rows."""
    T = x.shape[0]
    flat = np.empty(T * jobs.rows, np.float32)
    _launch(jobs, x, flat)
    return [flat[T * a : T * b].reshape(T, b - a) for a, b in jobs.bounds]


def on_tiles(jobs: Jobs, T: int) -> bool:
    """Whether a launch of T activation rows of these jobs runs on the AMX tiles."""
    return jobs.amx is not None and T >= amx_products.MIN_ROWS  # jobs_for: amx only where every matrix has tiles


def _launch(jobs: Jobs, x: np.ndarray, out: np.ndarray) -> None:
    w = jobs.weights[0]
    if on_tiles(jobs, x.shape[0]):
        assert jobs.amx is not None
        amx_products.product(jobs.amx, x, rounding_group(w), out)
        return
    PRODUCTS[activation_order(w)](jobs.table, x, rounding_group(w), w.nsteps, w.nchunks, out)


def _product_in(jobs: np.ndarray, x: np.ndarray, group: Int, nsteps: int, nchunks: int, out: np.ndarray) -> None:
    """x [T, cols] rounded per `group` columns for the jobs' kernels by _QUANTIZE (each
    copy's own order, cpu_ops.specialize), then run_jobs: one call from Python per launch
    (each numba call costs microseconds, and decode makes ~120 per token)."""
    A, S, N, C = _QUANTIZE(x, group, nsteps, nchunks, x.shape[0] < PARALLEL_ROWS)
    run_jobs(jobs, A, S, N, C, nsteps, nchunks, out)


_QUANTIZE = QUANTIZERS[PLAIN]  # bound per copy
_product_plain, _product_u4, _product_u6, _product_k4, _product_u5 = (
    specialize(_product_in, f"_product_{name}", _QUANTIZE=QUANTIZERS[order]) for name, order in zip(ORDER_NAMES, ORDERS)
)
PRODUCTS = dict(zip(ORDERS, (_product_plain, _product_u4, _product_u6, _product_k4, _product_u5)))


@cached_njit(nogil=True)
def _product(
    jobs: np.ndarray, x: np.ndarray, order: Int, group: Int, nsteps: int, nchunks: int, out: np.ndarray
) -> None:
    """PRODUCTS[order] for an activation `order` known only at run time (the decode tape's)."""
    if order == U5_ORDER:
        _product_u5(jobs, x, group, nsteps, nchunks, out)
    elif order == U4_ORDER:
        _product_u4(jobs, x, group, nsteps, nchunks, out)
    elif order == K4_ORDER:
        _product_k4(jobs, x, group, nsteps, nchunks, out)
    elif order == U6_ORDER:
        _product_u6(jobs, x, group, nsteps, nchunks, out)
    else:
        _product_plain(jobs, x, group, nsteps, nchunks, out)
