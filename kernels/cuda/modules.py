"""Compiles the CUDA C sources in kernels/cuda/ with cupy.RawModule and launches them.

Each `*.cu` file is one module; `#include "dequant.cuh"` is inlined here (so cupy's
on-disk cache, keyed by source text, sees header edits) and compiled once per process
for the current GPU's architecture. Launchers take cupy arrays, pick the grid and pass
scalars with the C types the kernels declare. They allocate nothing: outputs are passed in.

Only `import cupy` happens at call time, so this module imports on machines without it.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np

Array = Any  # a cupy.ndarray (cupy has no type information)
Kernel = Any  # a cupy.RawKernel: kernel(grid, block, args, shared_mem=0)

SOURCE_DIR = Path(__file__).parent
MV_MAX_COLS = 8  # activation rows one matvec launch handles (matvec.cu)
MV_WARPS = 4  # output rows per matvec block
MAX_HEAD_DIM = 256  # attention.cu's MAX_HD
PREFILL_TILE = 16  # queries per prefill attention tile (attention.cu's PQ)
_PK = 16

# ggml type id -> kernel name suffix, for the types the kernels read in block form
KERNEL_TYPES = {0: "f32", 1: "f16", 30: "bf16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 8: "q8_0", 12: "q4_k", 14: "q6_k"}
# ggml type id -> (elements per block, bytes per block) as the kernels see them
KERNEL_BLOCKS = {
    0: (32, 128), 1: (32, 64), 30: (32, 64), 2: (32, 18), 3: (32, 20), 6: (32, 22), 8: (32, 34),
    12: (256, 144), 14: (256, 210),
}
# elements one thread dequantizes (dequant.cu): 64 for the K-quants, else 32
_SEG = {t: (64 if qk == 256 else 32) for t, (qk, _) in KERNEL_BLOCKS.items()}

_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.M)


def source(name: str) -> str:
    """The text of kernels/cuda/<name>.cu with local includes inlined."""
    text = (SOURCE_DIR / f"{name}.cu").read_text()
    return _INCLUDE.sub(lambda m: (SOURCE_DIR / m.group(1)).read_text().replace("#pragma once", ""), text)


@functools.lru_cache(maxsize=None)
def module(name: str) -> Any:
    """The compiled cupy.RawModule of kernels/cuda/<name>.cu (compiled once per process)."""
    import cupy

    return cupy.RawModule(code=source(name), options=("-std=c++17",))


def kernel(module_name: str, fn: str) -> Kernel:
    """The function `fn` of the module of kernels/cuda/<module_name>.cu."""
    return module(module_name).get_function(fn)


def _blocks(n: int, threads: int) -> tuple[int]:
    return (max(1, -(-n // threads)),)


def matvec(
    qtype: int, w: Array, row_stride: int, K: int, N: int, x: Array, y: Array, bias: Array | None = None,
) -> None:
    """y[t, :N] = W @ x[t] (+ bias) for t < x.shape[0] <= MV_MAX_COLS.

    w: uint8 [N, row_stride] GGUF blocks (rows 16-byte padded); x [ncols, K] f32
    contiguous; y [ncols, N] f32 contiguous; bias [N] f32 or None.
    """
    ncols = x.shape[0]
    assert 0 < ncols <= MV_MAX_COLS and x.shape[1] == K and K % KERNEL_BLOCKS[qtype][0] == 0
    f = kernel("matvec", "mv_" + KERNEL_TYPES[qtype])
    f(_blocks(N, MV_WARPS), (MV_WARPS * 32,),
      (w, np.int64(row_stride), np.int32(K), np.int32(N), x, np.int32(x.shape[1]), y, np.int32(y.shape[1]),
       np.int32(ncols), 0 if bias is None else bias))


def dequant_rows(
    qtype: int, w: Array, row_stride: int, K: int, n_rows: int, out: Array, rows: Array | None = None,
) -> None:
    """out[r, :K] = row (rows[r] if rows is given, else r) of w as float values.

    out: f32 or f16 cupy [n_rows, >= K] C-contiguous; rows: int64 cupy [n_rows] or None.
    """
    import cupy

    suffix = "_f16" if out.dtype == cupy.float16 else "_f32"
    f = kernel("dequant", "dq_" + KERNEL_TYPES[qtype] + suffix)
    n_seg = n_rows * (K // _SEG[qtype])
    f(_blocks(n_seg, 256), (256,),
      (w, np.int64(row_stride), np.int32(K), np.int32(n_rows), 0 if rows is None else rows, out,
       np.int64(out.shape[1])))


def rms_norm(x: Array, w: Array, y: Array, eps: float) -> None:
    """y = RMSNorm(x) * w over the last axis; x, y [..., n] f32 contiguous, w [n]."""
    n = x.shape[-1]
    rows = x.size // n
    threads = 256 if n >= 256 else 32 * max(1, -(-n // 32))
    kernel("elementwise", "rms_norm")((rows,), (threads,), (x, w, y, np.int32(n), np.float32(eps)))


def rope(x: Array, positions: Array, y: Array, base: float, rope_dim: int, interleaved: bool) -> None:
    """y = x rotated at positions; x, y [T, heads, hd] f32, positions [T] int64."""
    T, heads, hd = x.shape
    kernel("elementwise", "rope")(_blocks(x.size, 256), (256,),
                                  (x, positions, y, np.int32(T), np.int32(heads), np.int32(hd), np.int32(rope_dim),
                                   np.float32(base), np.int32(1 if interleaved else 0)))


def glu(gate: Array, up: Array, out: Array, act: str) -> None:
    """out = act(gate) * up elementwise; act 'silu' or 'gelu_tanh'."""
    if act not in ("silu", "gelu_tanh"):
        raise ValueError(f"unknown GLU activation {act!r}")
    kernel("elementwise", "glu")(_blocks(gate.size, 256), (256,),
                                 (gate, up, out, np.int64(gate.size), np.int32(0 if act == "silu" else 1)))


def write_kv(k: Array, v: Array, slots: Array, kc: Array, vc: Array) -> None:
    """kc[slots[t]] = k[t], vc[slots[t]] = v[t]; k, v [T, Hkv, hd]; pools [n_slots, Hkv, hd]."""
    T = k.shape[0]
    width = k.size // max(T, 1)
    kernel("attention", "write_kv")(_blocks(k.size, 256), (256,), (k, v, slots, kc, vc, np.int32(T), np.int32(width)))


def attn_decode(q: Array, kc: Array, vc: Array, out: Array, dec_rows: Array, dec_seq: Array, n_dec: int,
                positions: Array, tables: Array, block_size: int, n_kv: int, scale: float, window: int) -> None:
    """Decode attention for n_dec single-token queries (rows dec_rows, sequences dec_seq)."""
    T, H, hd = q.shape
    assert hd <= MAX_HEAD_DIM
    kernel("attention", "attn_decode")((n_dec, H), (128,),
                                       (q, kc, vc, out, dec_rows, dec_seq, positions, tables, np.int32(tables.shape[1]),
                                        np.int32(block_size), np.int32(H), np.int32(n_kv), np.int32(hd),
                                        np.float32(scale), np.int32(window)))


def prefill_smem_bytes(hd: int) -> int:
    """The shared memory of one prefill attention block, in bytes."""
    return ((PREFILL_TILE + _PK) * (hd + 1) + PREFILL_TILE * _PK + 3 * PREFILL_TILE) * 4


def attn_prefill(q: Array, kc: Array, vc: Array, out: Array, tile_seq: Array, tile_q0: Array, n_tiles: int,
                 seq_start: Array, seq_ntok: Array, positions: Array, tables: Array, block_size: int, n_kv: int,
                 scale: float, window: int) -> None:
    """Causal prefill attention over n_tiles tiles of up to PREFILL_TILE queries."""
    T, H, hd = q.shape
    assert hd <= MAX_HEAD_DIM
    kernel("attention", "attn_prefill")((n_tiles, H), (128,),
                                        (q, kc, vc, out, tile_seq, tile_q0, seq_start, seq_ntok, positions, tables,
                                         np.int32(tables.shape[1]), np.int32(block_size), np.int32(H), np.int32(n_kv),
                                         np.int32(hd), np.float32(scale), np.int32(window)),
                                        shared_mem=prefill_smem_bytes(hd))


def topk_rows(logits: Array, k: int, out_ids: Array, out_vals: Array) -> None:
    """Top-k (value desc, then id asc) of each row of logits [R, V] f32 into [R, k] outputs."""
    R, V = logits.shape
    kernel("sampling", "topk_rows")((R,), (1024,), (logits, np.int64(V), np.int32(V), np.int32(k), out_ids, out_vals))
