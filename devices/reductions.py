"""A round's logits cut down, on the device, to what the sampler needs of each row.

Each row asks for one of (actors/logits_need.py decides): 0 the full row, 1 the argmax,
k the top-k candidates. Only full rows leave the device whole; the others leave as K ids
and values (K the largest k asked) plus the row's max, so a greedy round of 64 sequences
ships 64 x 16 bytes instead of 64 full rows. The executor wraps them in the wire message.
The candidates come in the order of kernels/oracle/topk.py's numpy_topk, the reference every
device's `topk` follows.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np


class TopRows(NamedTuple):
    """The top K candidates of some rows of a round's logits, on the host."""

    rows: list[int]  # which rows, in order
    ids: np.ndarray  # [len(rows), K] int64, best first
    values: np.ndarray  # [len(rows), K] float32
    row_max: np.ndarray  # [len(rows)] float32: each row's max (NaN propagates)


class ReducedRows(NamedTuple):
    """A round's logits [S, vocab] cut to what each row needs."""

    full: list[int]  # rows shipped whole, in order
    full_logits: np.ndarray  # [len(full), vocab] float32 on the host
    top: TopRows | None  # the other rows' candidates; None when every row is full


def reduce_rows(device: Any, logits: Any, needs: Sequence[int]) -> ReducedRows:
    """Split logits [S, vocab] (the device's array) by each row's need (0 full, k the top k,
    one need per row). K is the largest k asked; a k that reaches the vocabulary ships the
    full row. Reads logits only."""
    vocab = logits.shape[1]
    needs = [n if n < vocab else 0 for n in needs]
    full = [i for i, n in enumerate(needs) if n == 0]
    reduced = [i for i, n in enumerate(needs) if n > 0]
    if not reduced:
        return ReducedRows(full, device.to_numpy(logits), None)
    rows = logits if not full else logits[device.from_numpy(np.asarray(reduced, np.int64))]  # [S_k, vocab]
    k = max(needs[i] for i in reduced)
    ids, values = device.topk(rows, k)  # [S_k, K] each
    row_max = device.to_numpy(rows.max(axis=1)).astype(np.float32)  # [S_k]; NaN propagates
    if full:
        full_rows = device.to_numpy(logits[device.from_numpy(np.asarray(full, np.int64))])  # [S_full, vocab]
    else:
        full_rows = np.zeros((0, vocab), np.float32)
    return ReducedRows(full, full_rows, TopRows(reduced, ids, values, row_max))

