"""cpu-fast's decode graphs: a decode round recorded once as a tape, then replayed in one numba call.

The CPU analogue of devices/cuda_graph.py. A decode round (every sequence computes one
token, all of them want logits) of S sequences is padded up to a bucket size B with dummy
sequences (token 0 at position 0, writing into the KV pool's trash block: small rounds
are memory-bound, so a few more rows cost little) and recorded the first time a bucket is seen:
the forward runs as always, but each of cpu-fast's ops, instead of computing eagerly,
appends a node to a Tape (kernels/cpu_tape.py) and runs it, and its outputs come from
arrays the tape owns. What changes between rounds lives in a ctx of fixed buffers
(token ids, positions, slots, block tables), refilled before each replay; the kernels
read them, so every address in the tape stays valid. The embedding (the one op whose
kernel depends on the table's type) and products without int8 kernels stay Python steps
between the nodes.

Safety: an op given an activation the tape did not produce (an array made outside the
device ops, whose value the tape would freeze) stops the recording with NotRecordable,
and rounds of that shape run eagerly. After recording, the same round is replayed once
and must give the recorded logits bit for bit, or graphs are switched off with a warning.
Graphs read the KV pool the device allocated last; a round on another pool is refused.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import structlog

from zinfer.devices.base import Layers
from zinfer.devices.batch import ForwardBatch
from zinfer.kernels import cpu_tape as ct

log = structlog.get_logger("zinfer.devices")

BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)  # decode rounds are padded up to one of these sizes; each holds its logits [B, vocab]


class NotRecordable(Exception):
    """An op met something a tape cannot replay; the round runs eagerly instead."""


class Tape:
    """The steps of one recorded round in order: node arrays [n, WIDTH] for cpu_tape.replay
    and Python callables between them, and every array they name (pinned, so no address
    is ever freed while the tape lives)."""

    def __init__(self):
        self.steps: list[np.ndarray | Callable[[], None]] = []
        self._rows: list[np.ndarray] = []  # nodes not yet closed into a step
        self._pins: list[Any] = []
        self._owned: set[int] = set()  # ids of arrays whose values the tape produces or refills

    def own(self, a: np.ndarray) -> np.ndarray:
        """a as an array this tape writes or refills (ctx buffers, outputs)."""
        self._owned.add(id(a))
        self._pins.append(a)
        return a

    def out(self, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A new output array the tape owns."""
        return self.own(np.empty(shape, dtype))

    def act(self, a: np.ndarray) -> int:
        """The address of activation a: a C-contiguous view of an array this tape owns."""
        root = a
        while root.base is not None:
            root = root.base
        if id(root) not in self._owned or not a.flags.c_contiguous:
            raise NotRecordable(f"an activation of shape {a.shape} was made outside the recorded ops")
        return a.ctypes.data

    def pin(self, a: Any) -> int:
        """The address of a constant (a weight, a KV pool, a job table), kept alive."""
        self._pins.append(a)
        return a.ctypes.data

    def node(self, op: int, *args: int) -> None:
        """Append node [op, *args] and run it now (the recording round computes as replays will)."""
        row = np.zeros((1, ct.WIDTH), np.int64)
        row[0, 0] = op
        row[0, 1 : 1 + len(args)] = args
        self._rows.append(row)
        ct.replay(row)

    def python(self, step: Callable[[], None]) -> None:
        """Append a Python step and run it now."""
        self._close()
        self.steps.append(step)
        step()

    def finish(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._rows:
            self.steps.append(np.concatenate(self._rows))
            self._rows = []

    def run(self) -> None:
        """Replay every step in order."""
        for step in self.steps:
            if isinstance(step, np.ndarray):
                ct.replay(step)
            else:
                step()


@dataclass
class _Graph:
    tape: Tape
    buffers: "GraphBuffers"
    output: np.ndarray  # [B, vocab]: the logits each replay writes


@dataclass
class GraphBuffers:
    """The fixed arrays a graph's ctx reads, refilled from each round's batch; rows past
    the batch's are dummies (token 0 at position 0, in the trash block)."""

    S: int  # rows: the bucket
    width: int  # block-table columns: the longest table any sequence can have
    trash_block: int
    block_size: int
    token_ids: np.ndarray = field(init=False)  # [S] int64
    positions: np.ndarray = field(init=False)  # [S] int64
    slots: np.ndarray = field(init=False)  # [S] int64
    rows: np.ndarray = field(init=False)  # [S] int64: 0..S-1 (every row attends; every row's logits)
    tables: np.ndarray = field(init=False)  # [S, width] int32: past a table's end, stale (never read)

    def __post_init__(self):
        S = self.S
        self.token_ids, self.positions, self.slots = (np.zeros(S, np.int64) for _ in range(3))
        self.rows = np.arange(S, dtype=np.int64)
        self.tables = np.zeros((S, self.width), np.int32)

    def fill(self, batch: ForwardBatch) -> None:
        n = len(batch.seqs)
        self.token_ids[:n] = batch.token_ids
        self.positions[:n] = batch.positions
        self.slots[:n] = batch.slots
        self.token_ids[n:], self.positions[n:], self.slots[n:] = 0, 0, self.trash_block * self.block_size
        self.tables[n:, 0] = self.trash_block
        for i, s in enumerate(batch.seqs):  # attention reads a table only up to its position
            self.tables[i, : len(s.block_table)] = s.block_table

    def owned_by(self, tape: Tape) -> None:
        for a in (self.token_ids, self.positions, self.slots, self.rows, self.tables):
            tape.own(a)


class DecodeGraphs:
    """Records and replays the decode rounds of one KV pool (whose block `trash_block` no
    sequence owns), one graph per bucket.

    `recording` is the tape of the round being recorded (the device's ops read it), else None."""

    def __init__(self, dev, kv, trash_block: int):
        self.dev, self.kv, self.trash_block = dev, kv, trash_block
        self.recording: Tape | None = None
        self._graphs: dict[int, _Graph] = {}
        self._refused: set[int] = set()  # buckets whose recording met NotRecordable
        self.broken = False  # a replay disagreed with its recording: eager from then on
        self.last_replayed = False  # whether the last run replayed a tape (else it recorded or ran eagerly)
        self._compiled = threading.Event()  # cpu_tape.replay is ready
        self._compiling = False

    def compile_soon(self) -> None:
        """Compile (or load) cpu_tape.replay on a thread, once: decode rounds run eagerly until it
        is ready. Called after an eager decode round, so the first run's own kernels compile first."""
        if not self._compiling:
            self._compiling = True
            threading.Thread(target=self._compile, daemon=True, name="zinfer-tape-compile").start()

    def _compile(self) -> None:
        ct.replay(np.zeros((0, ct.WIDTH), np.int64))
        self._compiled.set()

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

    @property
    def ready(self) -> bool:
        """Whether replay is compiled (compile_soon)."""
        return self._compiled.is_set()

    def wait_compiled(self, timeout: float) -> bool:
        """Wait up to `timeout` s for a started compile; whether none is running."""
        return not self._compiling or self._compiled.wait(timeout)

    @staticmethod
    def bucket(S: int) -> int:
        """The bucket a decode round of S sequences is padded up to."""
        return next(b for b in BUCKETS if b >= S)

    def run(self, layers: Layers, batch: ForwardBatch) -> np.ndarray:
        """The logits [S, vocab] (a new array) that layers(begin_round(batch)) would give."""
        S = len(batch.seqs)
        B = self.bucket(S)
        graph = self._graphs.get(B)
        self.last_replayed = graph is not None
        if graph is None:
            graph = self._record(layers, batch, B)  # computes this round's logits
            if graph is None:
                return layers(self.dev.begin_round(batch))
        else:
            graph.buffers.fill(batch)
            graph.tape.run()
        return graph.output[:S].copy()

    def _record(self, layers: Layers, batch: ForwardBatch, B: int) -> _Graph | None:
        from zinfer.devices.cpu_fast import GraphRoundCtx

        tape = Tape()
        buffers = GraphBuffers(B, self.kv.num_blocks + 1, self.trash_block, self.kv.block_size)
        buffers.owned_by(tape)
        buffers.fill(batch)
        ctx = GraphRoundCtx(batch.padded(B, self.trash_block, self.kv.block_size), buffers.token_ids, buffers.positions, buffers.slots, buffers.rows, buffers=buffers, tape=tape)
        self.recording = tape
        try:
            output = layers(ctx)
        except NotRecordable as e:
            log.info("decode rounds run eagerly", bucket=B, reason=str(e))
            self._refused.add(B)
            return None
        finally:
            self.recording = None
        tape.finish()
        recorded = output.copy()
        tape.run()  # the same round again: it must give the same logits
        if not np.array_equal(recorded, output, equal_nan=True):
            log.warning("decode graphs off: a replay disagreed with its recording", bucket=B)
            self.broken = True
            return None
        graph = self._graphs[B] = _Graph(tape, buffers, output)
        return graph
