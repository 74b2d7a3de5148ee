"""cpu-fast decode graphs: a decode round recorded once per bucket, then replayed in one numba call.

A decode round of up to 16 sequences is padded up to a bucket (1, 2, 3, 4, 6, 8, 12, 16
rows; the padded rows cost little) and recorded the first time a bucket is seen: the
forward runs as always, but on a GraphRecorder (devices/cpu_graph_recorder.py), whose
ops append typed nodes to a Tape (kernels/cpu_fast/cpu_tape.py) and run them, so its outputs come
from arrays the tape owns. What changes between rounds lives in fixed buffers (token
ids, positions, slots, block tables), refilled before each replay; the kernels read
them, so every address in the tape stays valid.

The graphs belong to the KV pool they were recorded over: cpu-fast's alloc_kv makes a
GraphKV, which carries its own DecodeGraphs, so a round replays only graphs of the pool
it runs on. A pool's graphs replay the forward they were recorded from (its weights):
one pool serves one model.

Safety: an op given an activation the tape did not produce stops the recording with
NotRecordable, and rounds of that bucket run eagerly. After recording, the same round is
replayed once and must give the recorded logits bit for bit, or the pool's graphs are
switched off with a warning.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from zinfer.devices.base import Layers
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuKV
from zinfer.devices.cpu_fast_round import FastRoundCtx
from zinfer.devices.cpu_graph_recorder import GraphBuffers, GraphRecorder, NotRecordable, RecordedDevice, Tape
from zinfer.kernels.cpu_fast import cpu_tape as ct

log = structlog.get_logger("zinfer.devices")

# decode rounds are padded up to one of these sizes; each graph holds its logits [B, vocab]
BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)


class ReplayCompile:
    """The compile (or cache load) of cpu_tape.replay, on a thread, started once."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._started = False

    def start(self) -> None:
        """Start compiling, once: decode rounds run eagerly until it is ready. Called after an
        eager decode round, so the first run's own kernels compile first."""
        if not self._started:
            self._started = True
            threading.Thread(target=self._compile, daemon=True, name="zinfer-tape-compile").start()

    def _compile(self) -> None:
        ct.replay(np.zeros((0, ct.WIDTH), np.int64))
        self._done.set()

    @property
    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for a started compile; whether none is running."""
        return not self._started or self._done.wait(timeout)


@dataclass
class _Graph:
    tape: Tape
    buffers: GraphBuffers
    output: np.ndarray  # [B, vocab]: the logits each replay writes


class DecodeGraphs:
    """Records and replays the decode rounds of one KV pool, whose block `trash_block` no
    sequence owns (padded rows write there), one graph per bucket."""

    def __init__(self, trash_block: int, block_size: int):
        self.trash_block, self.block_size = trash_block, block_size
        self._graphs: dict[int, _Graph] = {}
        self._refused: set[int] = set()  # buckets whose recording met NotRecordable
        self.broken = False  # a replay disagreed with its recording: eager from then on
        self.last_replayed = False  # whether the last run replayed a tape (else it recorded or ran eagerly)

    def eligible(self, batch: ForwardBatch) -> bool:
        """A decode round of up to BUCKETS[-1] sequences, each wanting its logits, in a bucket not refused."""
        S = len(batch.seqs)
        return (
            not self.broken
            and 0 < S <= BUCKETS[-1]
            and all(s.n_tokens == 1 for s in batch.seqs)
            and len(batch.logits_rows) == S
            and self.bucket(S) not in self._refused
        )

    @staticmethod
    def bucket(S: int) -> int:
        """The bucket a decode round of S sequences is padded up to."""
        return next(b for b in BUCKETS if b >= S)

    def run(self, dev: RecordedDevice, layers: Layers[CpuKV, FastRoundCtx], batch: ForwardBatch) -> np.ndarray:
        """The logits [S, vocab] (a new array) that layers(dev, dev.begin_round(batch)) would
        give, on the pool these graphs belong to; dev: the FastCpuDevice."""
        S = len(batch.seqs)
        B = self.bucket(S)
        graph = self._graphs.get(B)
        self.last_replayed = graph is not None
        if graph is None:
            graph = self._record(dev, layers, batch, B)  # computes this round's logits
            if graph is None:
                logits: np.ndarray = layers(dev, dev.begin_round(batch))  # [S, vocab]
                return logits
        else:
            graph.buffers.fill(batch)
            graph.tape.run()
        return graph.output[:S].copy()

    def _record(self, dev: RecordedDevice, layers: Layers[CpuKV, FastRoundCtx], batch: ForwardBatch,
                B: int) -> _Graph | None:
        tape = Tape()
        buffers = GraphBuffers(B, self.trash_block + 1, self.trash_block, self.block_size)
        ctx = buffers.ctx(batch, tape)
        try:
            output = layers(GraphRecorder(dev, tape, buffers), ctx)
        except NotRecordable as e:
            log.info("decode rounds run eagerly", bucket=B, reason=str(e))
            self._refused.add(B)
            return None
        tape.finish()
        recorded = output.copy()
        tape.run()  # the same round again: it must give the same logits
        if not np.array_equal(recorded, output, equal_nan=True):
            log.warning("decode graphs off: a replay disagreed with its recording", bucket=B)
            self.broken = True
            return None
        graph = self._graphs[B] = _Graph(tape, buffers, output)
        return graph


@dataclass(eq=False)
class GraphKV(CpuKV):
    """A cpu-fast KV pool with the decode graphs recorded over it. Its arrays hold one block
    more than num_blocks: block num_blocks, the graphs' trash block."""

    graphs: DecodeGraphs

    @staticmethod
    def allocate(n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: type[np.floating[Any]]) -> "GraphKV":
        """num_blocks usable blocks and the trash block, zeroed, with no graph recorded yet."""
        pool = CpuKV.zeros(n_layers, n_kv_heads, head_dim, num_blocks + 1, block_size, dtype)
        return GraphKV(pool.k, pool.v, num_blocks, block_size, DecodeGraphs(num_blocks, block_size))
