"""The top-k order every device's `topk` follows, and its numpy reference.

`numpy_topk` is the reference (CudaDevice's kernel in kernels/cuda/sampling.cu follows it
too): value descending, ties to the lower id, NaN never chosen (a row with fewer than k
other entries pads with id -1, value -inf). The sampler's top_k (actors/sampling.py) takes
a full row's candidates with it, so they come in the order a device's candidates do.
"""

from __future__ import annotations

import numpy as np


def numpy_topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (id, value) of each row of logits [R, V] (or one row [V]): ids int64
    [R, k], values float32 [R, k], best first, ties to the lower id, NaN never chosen."""
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim == 1:
        x = x[None]
    R, V = x.shape
    if not 1 <= k <= V:
        raise ValueError(f"k must be in 1..{V}, got {k}")
    ids = np.full((R, k), -1, np.int64)
    values = np.full((R, k), -np.inf, np.float32)
    for r in range(R):
        row_ids = _row_topk(x[r], k)  # [<= k]
        ids[r, : row_ids.size] = row_ids
        values[r, : row_ids.size] = x[r, row_ids]
    return ids, values


def _row_topk(row: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k best of row [V] in (-value, id) order; fewer when NaN leaves fewer."""
    n = row.size
    if k == 1:
        ids = np.array([np.argmax(row)], np.int64)  # the first max: the lowest id (NaN wins argmax)
    else:
        ids = np.argpartition(row, n - k)[n - k :] if k < n else np.arange(n)  # NaN ranks last: in here
        t = row[ids].min()
        if not np.isnan(t) and np.count_nonzero(row == t) > np.count_nonzero(row[ids] == t):
            above = np.flatnonzero(row > t)  # fewer than k: the rest are ties at t, lower ids first
            ids = np.concatenate([above, np.flatnonzero(row == t)[: k - above.size]])
    if np.isnan(row[ids]).any():  # NaN is never chosen: rank among the other entries
        cols = np.flatnonzero(~np.isnan(row))  # [V'] the entries that may be chosen
        return cols[_row_topk(row[cols], k)] if cols.size > k else cols[np.lexsort((cols, -row[cols]))]
    return ids[np.lexsort((ids, -row[ids]))]
