"""Causal attention of one sequence's long chunk on every core, without BLAS.

The chunk's keys and values are gathered once per layer from the paged pools into f32
(keys transposed), then each parallel task takes `mr` query rows of one head
(gemm_ir.prefill_rows(): the rows of the GEMM kernel it calls): scores for the keys those
rows see (16 at a time, by gemm_ir.py), a softmax per row, and the rows' outputs from the
probabilities and values. Only the causal triangle (and the sliding window) is computed, and
the temporaries are [mr, keys]. Matches oracle.reference up to f32 summation order, and
decode's paged attention (cpu_ops.py) bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast import gemm_ir
from zinfer.kernels.cpu_fast.cpu_ops import as_f32, softmax_
from zinfer.kernels.cpu_fast.gemm_ir import NR as GEMM_NR
from zinfer.kernels.cpu_fast.gemm_ir import GemmArgs
from zinfer.kernels.cpu_fast.kernel_signature import call_kernel
from zinfer.kernels.cpu_fast.numba_types import Float, Int


@cached_njit(parallel=True, nogil=True)
def gather_keys_values(
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    table: np.ndarray,
    block_size: Int,
    k0: Int,
    kt: np.ndarray,
    v: np.ndarray,
) -> None:
    """Keys k0 + j of one sequence from the paged pools [slots, Hkv, hd] (f32, or uint16
    holding f16) into kt [Hkv, hd, >= n] (transposed) and v [Hkv, >= n, hd], f32, for
    j < n = number of keys wanted (kt.shape[2] rounded up: the caller zero-pads)."""
    Hkv, hd = k_pool.shape[1], k_pool.shape[2]
    n = v.shape[1] - GEMM_NR  # the last GEMM_NR rows are padding
    for j in prange(n):
        key = k0 + j
        slot = table[key // block_size] * block_size + key % block_size
        for g in range(Hkv):
            for i in range(hd):
                kt[g, i, j] = as_f32(k_pool[slot, g, i])
                v[g, j, i] = as_f32(v_pool[slot, g, i])


@cached_njit(parallel=True, fastmath=True, nogil=True, error_model="numpy")  # see cpu_ops.py
def chunk_attention(
    gemm: Int,
    mr: Int,
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    q_pos: np.ndarray,
    k0: Int,
    scale: Float,
    window: Int,
    out: np.ndarray,
) -> None:
    """out [n, H, hd] = attention of q [n, H, hd] (positions q_pos [n], increasing) over
    the keys at positions k0 + j held in kt [Hkv, hd, nk + GEMM_NR], v [Hkv, nk + GEMM_NR, hd]
    (zero past nk); `gemm`: address of the gemm_ir kernel of `mr` rows. Row t sees keys at positions
    <= q_pos[t], and > q_pos[t] - window when window > 0."""
    n, H, hd = q.shape
    Hkv = kt.shape[0]
    grp = H // Hkv
    ldk = kt.shape[2]
    blocks = (n + mr - 1) // mr
    for item in prange(H * blocks):
        h = item % H
        # later blocks see more keys: pair block i with block blocks-1-i so that both
        # halves of the (statically split) range carry the same work
        pair = item // H
        blk = pair // 2 if pair % 2 == 0 else blocks - 1 - pair // 2
        g = h // grp
        a = blk * mr
        rows = min(n, a + mr) - a
        hi = q_pos[a + rows - 1] + 1 - k0  # keys the block's last row sees: [lo, hi)
        lo = max(0, q_pos[a] - window + 1 - k0) if window > 0 else 0
        c0 = lo // GEMM_NR * GEMM_NR  # first score column computed
        width = (hi - c0 + GEMM_NR - 1) // GEMM_NR * GEMM_NR
        qb = np.zeros((mr, hd), np.float32)  # the block's query rows (zero padded)
        for r in range(rows):
            qb[r] = q[a + r, h]
        s = np.empty((mr, width), np.float32)  # scores of keys c0 + j
        for c in range(0, width, GEMM_NR):
            keys = kt[g].ctypes.data + (c0 + c) * 4
            scores = s.ctypes.data + c * 4
            call_kernel(gemm, GemmArgs(A=qb.ctypes.data, lda=hd, B=keys, ldb=ldk, C=scores, ldc=width, K=hd))
        for r in range(mr):
            row = s[r]
            if r >= rows:
                row[:] = 0
                continue
            p = q_pos[a + r] - k0
            r_lo = max(0, p - window + 1) if window > 0 else 0
            softmax_(row[r_lo - c0 : p + 1 - c0], scale)  # the keys row r sees
            row[: r_lo - c0] = 0
            row[p + 1 - c0 :] = 0
        o = np.empty((mr, hd), np.float32)
        for d in range(0, hd, GEMM_NR):
            values = v[g].ctypes.data + (c0 * hd + d) * 4
            outs = o.ctypes.data + d * 4
            call_kernel(gemm, GemmArgs(A=s.ctypes.data, lda=width, B=values, ldb=hd, C=outs, ldc=hd, K=hi - c0))
        for r in range(rows):
            out[a + r, h] = o[r]


def supported(head_dim: int) -> bool:
    """Whether chunk_attention runs here and handles heads of this size."""
    return head_dim % GEMM_NR == 0 and gemm_ir.address() is not None
