"""CUDA graphs for decode rounds: one captured graph per batch-size bucket.

A decode round (every sequence computes one token) is padded up to a bucket size B with
dummy sequences (token 0 at position 0, writing into the KV pool's trash block), and
its whole forward (`layers` on the device, embedding to logits) is captured once on the
device's stream over a ctx of fixed capacity, then replayed. The graphs belong to the
KV pool they were captured over (CudaKV.graphs). What changes between rounds lives
in that ctx's device buffers (devices/cuda_round.RoundMeta: token ids, positions, slots,
context via positions, block tables), refilled by begin_round before each replay;
kernels read them, so launch shapes stay fixed.

Activations allocated during capture come from a private cupy memory pool that lives
as long as the graph, so no later allocation can reuse addresses a replay writes.
The switch is CudaConfig.cuda_graphs; it can only be verified on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from zinfer.devices.base import Layers, RoundOps
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cuda_round import CudaRoundCtx, RoundMeta


@dataclass
class _Captured:
    graph: Any
    meta: RoundMeta  # of capacity B
    pool: Any  # the private cupy MemoryPool its activations live in
    output: Any  # device logits [B, vocab] the graph writes


@dataclass(eq=False)
class CudaKV:
    """Per layer K and V pools, [(num_blocks + 1) * block_size, Hkv, hd] float32 cupy arrays
    (flat slots), and the decode graphs captured over them (None: CudaConfig.cuda_graphs off).

    Block `num_blocks` is the trash block: padded graph rows write there, nothing reads it."""

    k: list[Any]
    v: list[Any]
    num_blocks: int
    block_size: int
    graphs: DecodeGraphs | None = None


class CapturingDevice(RoundOps[CudaKV, CudaRoundCtx], Protocol):
    """What capturing needs of the device (devices/cuda.py CudaDevice): its ops, its cupy
    module and stream, and a round ctx over given metadata buffers."""

    cupy: Any
    stream: Any  # a cupy Stream

    def begin_round(self, batch: ForwardBatch, meta: RoundMeta | None = None) -> CudaRoundCtx:
        """The round's ctx over the buffers of `meta` (None: the device's eager ones)."""


class DecodeGraphs:
    """Captures and replays decode rounds of one KV pool (whose block `trash_block` no
    sequence owns), per bucket in `buckets`."""

    def __init__(self, trash_block: int, block_size: int, buckets: tuple[int, ...], max_context: int) -> None:
        self.trash_block, self.block_size = trash_block, block_size
        self.buckets = tuple(sorted(buckets))
        self.width = -(-max_context // block_size)  # block-table width of every bucket
        self._graphs: dict[int, _Captured] = {}

    def eligible(self, batch: ForwardBatch) -> bool:
        """A decode round small enough for a bucket, with every table inside the width."""
        return (
            bool(batch.seqs)
            and len(batch.seqs) <= self.buckets[-1]
            and all(s.n_tokens == 1 for s in batch.seqs)
            and all(len(s.block_table) <= self.width for s in batch.seqs)
        )

    def run(self, dev: CapturingDevice, layers: Layers[CudaKV, CudaRoundCtx], batch: ForwardBatch) -> Any:
        """Device logits [S, vocab] of batch.logits_rows, as layers(dev, dev.begin_round(batch))
        would return them; the first round of a bucket captures its graph. dev: the CudaDevice."""
        cp = dev.cupy
        B = next(b for b in self.buckets if b >= len(batch.seqs))
        padded = batch.padded(B, self.trash_block, self.block_size)
        stream = dev.stream
        with stream:
            cap = self._graphs.get(B)
            if cap is None:
                cap = self._graphs[B] = self._capture(dev, layers, padded, B)
            dev.begin_round(padded, cap.meta)  # refill the buffers the graph reads
            cap.graph.launch(stream=stream)
            # a gather into a fresh array, ordered after the replay on this stream: the
            # next replay rewrites cap.output. The device's stream is blocking, so a copy
            # on the legacy default stream (to_numpy) waits for both.
            logits = cap.output[cp.asarray(batch.logits_rows)]
        return logits

    def _capture(self, dev: CapturingDevice, layers: Layers[CudaKV, CudaRoundCtx], padded: ForwardBatch,
                 B: int) -> _Captured:
        cp = dev.cupy
        meta = RoundMeta(B, B, self.width)
        pool = cp.cuda.MemoryPool()
        stream = dev.stream
        with cp.cuda.using_allocator(pool.malloc):
            ctx = dev.begin_round(padded, meta)  # the fixed-capacity ctx every replay reads
            layers(dev, ctx)  # warm-up: compiles kernels, fills the private pool
            stream.synchronize()
            stream.begin_capture()
            try:
                output = layers(dev, ctx)
            finally:
                graph = stream.end_capture()
        return _Captured(graph, meta, pool, output)
