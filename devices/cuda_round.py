"""A CUDA round's context: its metadata in fixed-capacity device buffers that the ctx views.

begin_round uploads a round's token ids, positions, slots, block tables and the attention
kernels' metadata into a RoundMeta; a captured graph (devices/cuda_graph.py) owns one of
its bucket's capacity and reads the same addresses at every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zinfer.devices.batch import ForwardBatch
from zinfer.devices.round import RoundCtx
from zinfer.kernels.cuda import modules as km


class RoundMeta:
    """Device copies of one round's metadata, in two buffers of fixed capacity (so a
    captured graph keeps reading the same addresses while `fill` changes the values)."""

    def __init__(self, cap_tokens: int, cap_seqs: int, width: int) -> None:
        import cupy

        self.cap_t, self.cap_s, self.width = cap_tokens, cap_seqs, width
        self.h64 = np.zeros(3 * cap_tokens + cap_seqs, np.int64)
        self.h32 = np.zeros(4 * cap_tokens + 2 * cap_seqs + cap_seqs * width, np.int32)
        self.d64 = cupy.zeros(self.h64.shape, cupy.int64)
        self.d32 = cupy.zeros(self.h32.shape, cupy.int32)
        T, S = cap_tokens, cap_seqs
        self.tok, self.pos, self.slots = (self.d64[i * T:(i + 1) * T] for i in range(3))
        self.rows = self.d64[3 * T:3 * T + S]
        self.dec_rows, self.dec_seq, self.tile_seq, self.tile_q0 = (self.d32[i * T:(i + 1) * T] for i in range(4))
        self.seq_start = self.d32[4 * T:4 * T + S]
        self.seq_ntok = self.d32[4 * T + S:4 * T + 2 * S]
        self.tables = self.d32[4 * T + 2 * S:].reshape(S, width)
        self.n_tokens = self.n_dec = self.n_tiles = self.n_rows = 0

    def fits(self, batch: ForwardBatch, width: int) -> bool:
        return batch.n_tokens <= self.cap_t and len(batch.seqs) <= self.cap_s and width <= self.width

    def fill(self, batch: ForwardBatch) -> None:
        """Upload batch's metadata (two host-to-device copies on the current stream)."""
        T, S, W = batch.n_tokens, len(batch.seqs), self.width
        h64, h32 = self.h64, self.h32
        cT, cS = self.cap_t, self.cap_s
        h64[0:T] = batch.token_ids
        h64[cT:cT + T] = batch.positions
        h64[2 * cT:2 * cT + T] = batch.slots
        h64[3 * cT:3 * cT + len(batch.logits_rows)] = batch.logits_rows
        dec_rows, dec_seq, tile_seq, tile_q0 = [], [], [], []
        tables = h32[4 * cT + 2 * cS:].reshape(cS, W)
        for i, s in enumerate(batch.seqs):
            h32[4 * cT + i] = s.start
            h32[4 * cT + cS + i] = s.n_tokens
            tables[i, :len(s.block_table)] = s.block_table
            if s.n_tokens == 1:
                dec_rows.append(s.start)
                dec_seq.append(i)
            else:
                for q0 in range(0, s.n_tokens, km.PREFILL_TILE):
                    tile_seq.append(i)
                    tile_q0.append(q0)
        for j, vals in enumerate((dec_rows, dec_seq, tile_seq, tile_q0)):
            h32[j * cT:j * cT + len(vals)] = vals
        self.n_tokens, self.n_dec, self.n_tiles, self.n_rows = T, len(dec_rows), len(tile_seq), len(batch.logits_rows)
        self.d64.set(h64)
        end32 = 4 * cT + 2 * cS + S * W
        self.d32[:end32].set(h32[:end32])


@dataclass(frozen=True, eq=False)
class CudaRoundCtx(RoundCtx):
    """A CUDA round: token_ids, positions, slots and logits_rows are views of `meta`'s
    device buffers, which also hold the attention kernels' metadata."""

    meta: RoundMeta
