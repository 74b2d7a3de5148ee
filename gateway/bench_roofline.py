"""Bytes a batch-1 decode step reads, and this machine's read bandwidth: `zinfer bench`'s GB/s.

At batch 1 every decoded token streams every weight matrix once (the embedding table
only for one row, left out; a tied LM head counts the table once, as the head) and the
KV cells it attends over. GB/s = those bytes x batch-1 tok/s; against the bandwidth
measured here it says how close decode is to memory-bound.
"""

from __future__ import annotations

import time
from typing import Any

import numba
import numpy as np

from zinfer.models.loader import ModelSource
from zinfer.models.spec import ModelSpec
from zinfer.models.weights import ModelWeights


def file_weight_bytes(source: ModelSource) -> int:
    """Bytes of every tensor the forward reads per token, as the file stores them."""
    tied = "output.weight" not in source.tensors
    read = [t for name, t in source.tensors.items() if name != "token_embd.weight" or tied]
    return sum(int(np.asarray(t.data).nbytes) for t in read)


def resident_weight_bytes(weights: ModelWeights) -> int | None:
    """The same bytes as the device holds the weights (cpu-fast may hold more than the
    file, e.g. a type widened to int8); None for a form this cannot size."""
    layers = [w for layer in weights.layers for w in vars(layer).values() if w is not None]
    parts = [weights.out_norm, weights.output, *layers]
    try:
        return sum(_read_bytes(w) for w in parts)
    except (AttributeError, TypeError):
        return None


def _read_bytes(w: Any) -> int:
    """Bytes one batch-1 product streams from a resident weight: cpu-fast's int8 view or
    packed blocks where it keeps them (not its f32 copy for large rounds), else the array."""
    for form in ("int8", "packed"):
        part = getattr(w, form, None)
        if part is not None:
            return int(part.nbytes)
    return int(w.nbytes)


def kv_bytes_per_token(spec: ModelSpec, context: int, itemsize: int) -> int:
    """K and V bytes one decode step reads attending over `context` positions (a sliding
    window layer reads at most its window)."""
    cells = sum(min(context, spec.layer_window(i) or context) for i in range(spec.n_layers))
    return 2 * cells * spec.n_kv_heads * spec.head_dim * itemsize


def kv_itemsize(kv: Any, default: int) -> int:
    """Bytes per K/V value of a device's KV storage (its first K pool's dtype), else default."""
    try:
        return int(kv.k[0].dtype.itemsize)
    except (AttributeError, IndexError, TypeError):
        return default


@numba.njit(parallel=True, fastmath=True, cache=False)
def _sum_rows(a: np.ndarray) -> np.ndarray:
    """Row sums of a [rows, n] float32 array, rows spread over numba's threads."""
    out = np.zeros(a.shape[0], np.float32)
    for r in numba.prange(a.shape[0]):
        s = np.float32(0.0)
        for i in range(a.shape[1]):
            s += a[r, i]
        out[r] = s
    return out


def read_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """GB/s of a parallel sum over an nbytes float32 array on `threads` numba threads, the
    best of `repeats` passes (the first compiles). Sets numba's thread count."""
    most = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # numba.config sets its options at import
    numba.set_num_threads(max(1, min(threads, most)))
    rows = max(1, min(256, nbytes // (1 << 20)))
    a = np.ones((rows, max(1, nbytes // 4 // rows)), np.float32)  # [rows, n], pages touched here
    _sum_rows(a[:1, :16])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _sum_rows(a)
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9
