"""cpu-fast's round context: contiguous int64 arrays, RoPE tables from the numba kernel,
and the attention split every layer of the round shares."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zinfer.devices.batch import SeqChunk
from zinfer.devices.round import RoundCtx
from zinfer.kernels.cpu_fast import cpu_ops as ops
from zinfer.kernels.oracle.rope import RopeScaling, inv_freq as rope_inv_freq

LONG_CHUNK = 32  # a sequence's rows from which attention gathers its keys and goes blockwise


@dataclass(frozen=True)
class AttentionSplit:
    """A round's sequences as cpu-fast's attention runs them: `long` chunks one by one
    through the blockwise kernel, the rest in one paged-attention launch over `short`
    (rows [n] of those sequences, row_seq [T] and their padded block tables [S', B]),
    or None when every sequence is long."""

    long: list[SeqChunk]
    short: tuple[np.ndarray, np.ndarray, np.ndarray] | None


@dataclass(frozen=True, eq=False)
class FastRoundCtx(RoundCtx):
    """cpu-fast's round: positions and slots contiguous int64, RoPE tables from the numba
    kernel, and the attention split that every layer of the round shares."""

    _splits: dict[bool, AttentionSplit] = field(default_factory=dict, init=False, repr=False)  # by `blockwise`

    def rope_table(self, base: float, rope_dim: int,
                   scaling: RopeScaling | None = None) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [T, rope_dim/2], once per round and base (every layer asks)."""
        inv_freq, mscale = rope_inv_freq(base, rope_dim, scaling)  # [rope_dim/2] f32, scaled as llama.cpp does
        T = self.positions.shape[0]
        table = (np.empty((T, rope_dim // 2), np.float32), np.empty((T, rope_dim // 2), np.float32))
        ops.rope_table(self.positions, inv_freq, *table)
        if mscale != 1:  # YaRN's magnitude
            table[0][...] *= mscale
            table[1][...] *= mscale
        return table

    def attention_split(self, blockwise: bool) -> AttentionSplit:
        """The split for this round (blockwise: the head size has the blockwise kernel, so
        chunks of LONG_CHUNK rows or more take it), made on the first layer's ask."""
        split = self._splits.get(blockwise)
        if split is None:
            long_chunk = LONG_CHUNK if blockwise else self.n_tokens + 1
            seqs = self.batch.seqs
            short = [s for s in seqs if s.n_tokens < long_chunk]
            long = [s for s in seqs if s.n_tokens >= long_chunk]
            split = self._splits[blockwise] = AttentionSplit(long, _short_rows(self.n_tokens, short) if short else None)
        return split


def _short_rows(T: int, seqs: list[SeqChunk]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rows [n] of the given sequences, row_seq [T] and their padded block tables [S, B]."""
    width = max(len(s.block_table) for s in seqs)
    tables = np.zeros((len(seqs), width), np.int32)
    row_seq = np.zeros(T, np.int64)
    rows = []
    for i, s in enumerate(seqs):
        tables[i, : len(s.block_table)] = s.block_table
        row_seq[s.start : s.start + s.n_tokens] = i
        rows.append(np.arange(s.start, s.start + s.n_tokens, dtype=np.int64))
    return np.concatenate(rows), row_seq, tables
