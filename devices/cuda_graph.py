"""CUDA graphs for decode rounds: one captured graph per batch-size bucket.

A decode round (every sequence computes one token) is padded up to a bucket size B with
dummy sequences (token 0 at position 0, writing into the KV pool's trash block), and
its whole forward — embedding to logits — is captured once on the device's stream and
replayed afterwards. What changes between rounds lives in fixed device buffers
(devices/cuda.RoundMeta: token ids, positions, slots, context via positions, block
tables), refilled before each replay; kernels read them, so launch shapes stay fixed.

Activations allocated during capture come from a private cupy memory pool that lives
as long as the graph, so no later allocation can reuse addresses a replay writes.
The switch is CudaConfig.cuda_graphs; it can only be verified on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from zinfer.devices.batch import ForwardBatch, SeqChunk


@dataclass
class _Captured:
    graph: Any
    meta: Any  # RoundMeta of capacity B
    pool: Any  # the private cupy MemoryPool its activations live in
    output: Any  # device logits [B, vocab] the graph writes


class DecodeGraphs:
    """Captures and replays decode rounds of one KV pool, per bucket in `buckets`."""

    def __init__(self, dev, kv, buckets: tuple[int, ...], max_context: int):
        self.dev, self.kv = dev, kv
        self.buckets = tuple(sorted(buckets))
        self.width = -(-max_context // kv.block_size)  # block-table width of every bucket
        self._graphs: dict[int, _Captured] = {}

    def eligible(self, batch: ForwardBatch) -> bool:
        """A decode round small enough for a bucket, with every table inside the width."""
        return (
            bool(batch.seqs)
            and len(batch.seqs) <= self.buckets[-1]
            and all(s.n_tokens == 1 for s in batch.seqs)
            and all(len(s.block_table) <= self.width for s in batch.seqs)
        )

    def run(self, round_fn: Callable[[ForwardBatch], np.ndarray], batch: ForwardBatch) -> np.ndarray:
        """Logits [S, vocab] of batch.logits_rows, as round_fn(batch) would return them."""
        cp = self.dev.cupy
        B = next(b for b in self.buckets if b >= len(batch.seqs))
        padded = self._pad(batch, B)
        stream = self.dev.stream
        with stream:
            cap = self._graphs.get(B)
            if cap is None:
                cap = self._graphs[B] = self._capture(round_fn, padded, B)
            self.dev.prepare(padded, cap.meta)
            self.dev._meta_batch = None  # eager rounds re-upload their own metadata
            cap.graph.launch(stream=stream)
            logits = cp.asnumpy(cap.output, stream=stream)
            stream.synchronize()
        return logits[batch.logits_rows]

    def _capture(self, round_fn, padded: ForwardBatch, B: int) -> _Captured:
        from zinfer.devices.cuda import RoundMeta

        cp, dev = self.dev.cupy, self.dev
        meta = RoundMeta(B, B, self.width)
        pool = cp.cuda.MemoryPool()
        stream = dev.stream
        with cp.cuda.using_allocator(pool.malloc):
            dev.prepare(padded, meta)
            round_fn(padded)  # warm-up: compiles kernels, fills the private pool
            stream.synchronize()
            dev.begin_capture(padded, meta)
            stream.begin_capture()
            try:
                round_fn(padded)
            finally:
                graph = stream.end_capture()
                dev.end_capture()
        if not dev.captured_outputs:
            raise RuntimeError("the captured round produced no logits")
        return _Captured(graph, meta, pool, dev.captured_outputs[-1])

    def _pad(self, batch: ForwardBatch, B: int) -> ForwardBatch:
        """batch plus B - S dummy one-token sequences into the trash block; logits for all rows."""
        S, bs, trash = len(batch.seqs), self.kv.block_size, self.kv.trash_block
        n = B - S
        table = np.array([trash], np.int32)
        return ForwardBatch(
            token_ids=np.concatenate([batch.token_ids, np.zeros(n, np.int64)]),
            positions=np.concatenate([batch.positions, np.zeros(n, np.int64)]),
            slots=np.concatenate([batch.slots, np.full(n, trash * bs, np.int64)]),
            seqs=list(batch.seqs) + [SeqChunk(S + i, 1, 1, table) for i in range(n)],
            logits_rows=np.arange(B, dtype=np.int64),
        )
