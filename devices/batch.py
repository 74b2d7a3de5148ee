"""ForwardBatch: one round's work on the host, flattened the way vLLM V1 lays it out.

A round computes some tokens for each of several sequences: a whole prompt (prefill),
the next chunk of one (append prefill) or one token (decode). All three are the same
thing here: a run of consecutive positions whose keys and values join the sequence's
paged KV cache, attending to everything before them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's share of a round."""

    start: int  # offset of its tokens in the round's flat arrays
    n_tokens: int  # tokens computed this round
    context_len: int  # tokens in its KV cache after this round (last position + 1)
    block_table: np.ndarray  # [n_blocks] int32: KV block ids in position order


@dataclass(frozen=True)
class ForwardBatch:
    token_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slots: np.ndarray  # [T] int64: block_id * block_size + offset where each token's K/V goes
    seqs: list[SeqChunk]
    logits_rows: np.ndarray  # [S] int64: rows of T whose logits the round returns

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @staticmethod
    def build(
        chunks: Sequence[tuple[Sequence[int], int, Sequence[int], bool]],
        block_size: int,
    ) -> "ForwardBatch":
        """Flatten (token_ids, first_position, block_table, wants_logits) per sequence.

        The block table must cover first_position + len(token_ids) tokens.
        """
        ids: list[np.ndarray] = []
        pos: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        seqs: list[SeqChunk] = []
        rows: list[int] = []
        start = 0
        for tokens, first, block_table, wants_logits in chunks:
            n = len(tokens)
            table = np.asarray(block_table, dtype=np.int32)  # [n_blocks]
            end = first + n
            if len(table) * block_size < end:
                raise ValueError(f"block table of {len(table)} blocks cannot hold {end} tokens")
            p = np.arange(first, end, dtype=np.int64)
            ids.append(np.asarray(tokens, dtype=np.int64))
            pos.append(p)
            slots.append(table[p // block_size].astype(np.int64) * block_size + p % block_size)
            seqs.append(SeqChunk(start, n, end, table))
            if wants_logits:
                rows.append(start + n - 1)
            start += n
        return ForwardBatch(
            token_ids=np.concatenate(ids),
            positions=np.concatenate(pos),
            slots=np.concatenate(slots),
            seqs=seqs,
            logits_rows=np.asarray(rows, dtype=np.int64),
        )

    def padded(self, B: int, trash_block: int, block_size: int) -> "ForwardBatch":
        """This decode round plus B - S dummy one-token sequences (token 0 at position 0,
        writing into the trash block); logits for all B rows (the decode graphs' shape)."""
        S = len(self.seqs)
        n = B - S
        table = np.array([trash_block], np.int32)
        return ForwardBatch(
            token_ids=np.concatenate([self.token_ids, np.zeros(n, np.int64)]),
            positions=np.concatenate([self.positions, np.zeros(n, np.int64)]),
            slots=np.concatenate([self.slots, np.full(n, trash_block * block_size, np.int64)]),
            seqs=list(self.seqs) + [SeqChunk(S + i, 1, 1, table) for i in range(n)],
            logits_rows=np.arange(B, dtype=np.int64),
        )
