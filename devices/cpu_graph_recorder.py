"""Recording a cpu-fast decode round: the Tape, and the GraphRecorder the forward runs on.

A GraphRecorder has the device ops of FastCpuDevice (devices/base.py's protocol), and
each appends its typed node (kernels/cpu_fast/cpu_tape.py) to the tape, runs it at once (the
recording round computes as its replays will) and returns outputs the tape owns. It
mirrors the eager ops for the rounds a graph takes: one token per sequence, every row
short, so attention is the one paged kernel. The embedding (whose kernel depends on the
table's type) and products without int8 kernels are Python steps between the nodes.

An activation the tape did not produce (an array made outside the ops, whose value the
tape would freeze) raises NotRecordable, and the round runs eagerly instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from zinfer.devices.base import RoundOps
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuKV
from zinfer.devices.cpu_fast_linears import FastWeight
from zinfer.devices.cpu_fast_round import FastRoundCtx
from zinfer.devices.round import RopeKey, rope_key
from zinfer.kernels.cpu_fast import gemm_ir
from zinfer.kernels.cpu_fast.int8 import amx_products
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast import cpu_tape as ct
from zinfer.kernels.oracle.rope import RopeScaling, inv_freq as rope_inv_freq


class NotRecordable(Exception):
    """An op met something a tape cannot replay; the round runs eagerly instead."""


Int8Group = tuple[ci.Jobs, list[int]]  # one launch's jobs, and the indices of its matrices in the ws given


class RecordedDevice(RoundOps[CpuKV, FastRoundCtx], Protocol):
    """What recording needs of the device whose round it records (devices/cpu_fast.py
    FastCpuDevice): its ops, its round ctx, and its int8 matrices grouped per launch."""

    name: str

    def begin_round(self, batch: ForwardBatch) -> FastRoundCtx:
        """The round's ctx, as for an eager round."""

    def int8_jobs(self, ws: tuple[FastWeight, ...]) -> list[Int8Group]:
        """ws's int8 matrices grouped by activation layout: [(their jobs, their indices in ws)]."""


class Tape:
    """The steps of one recorded round in order: node arrays [n, WIDTH] for cpu_tape.replay
    and Python callables between them, and every array they name (pinned, so no address
    is ever freed while the tape lives)."""

    def __init__(self) -> None:
        self.steps: list[np.ndarray | Callable[[], None]] = []
        self._rows: list[np.ndarray] = []  # nodes [1, WIDTH] not yet closed into a step
        self._pins: list[Any] = []
        self._owned: set[int] = set()  # ids of arrays whose values the tape produces or refills

    def own(self, a: np.ndarray) -> np.ndarray:
        """a as an array this tape writes or refills (ctx buffers, outputs)."""
        self._owned.add(id(a))
        self._pins.append(a)
        return a

    def out(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A new output array the tape owns."""
        return self.own(np.empty(shape, dtype))

    def act(self, a: np.ndarray) -> ct.Address:
        """The address of activation a: a C-contiguous view of an array this tape owns."""
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        if id(root) not in self._owned or not a.flags.c_contiguous:
            raise NotRecordable(f"an activation of shape {a.shape} was made outside the recorded ops")
        return ct.Address(int(a.ctypes.data))

    def pin(self, a: np.ndarray) -> ct.Address:
        """The address of a constant (a weight, a KV pool, a job table), kept alive."""
        self._pins.append(a)
        return ct.Address(int(a.ctypes.data))

    def node(self, node: tuple[object, ...]) -> None:
        """Append a node (a kernels/cpu_fast/cpu_tape.py record; TypeError for a wrongly typed field)
        and run it now."""
        row = ct.pack(node)[None]  # [1, WIDTH]
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

    def __post_init__(self) -> None:
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

    def ctx(self, batch: ForwardBatch, tape: Tape) -> FastRoundCtx:
        """The ctx of batch (padded to S rows) over these buffers, which `tape` then owns."""
        for a in (self.token_ids, self.positions, self.slots, self.rows, self.tables):
            tape.own(a)
        self.fill(batch)
        padded = batch.padded(self.S, self.trash_block, self.block_size)
        return FastRoundCtx(padded, self.token_ids, self.positions, self.slots, self.rows)


class GraphRecorder:
    """cpu-fast's ops onto a tape: `dev` the FastCpuDevice whose kernels the nodes call
    (its embed and non-int8 products run as Python steps), `buffers` the ctx's arrays.
    One recorder records one round."""

    def __init__(self, dev: RecordedDevice, tape: Tape, buffers: GraphBuffers) -> None:
        self.dev, self.tape, self.buffers = dev, tape, buffers
        self.name = dev.name
        self._rope: dict[RopeKey, tuple[np.ndarray, np.ndarray]] = {}  # -> cos, sin [T, rope_dim/2], tape nodes

    def embed(self, table: np.ndarray | FastWeight, token_ids: np.ndarray) -> np.ndarray:
        """A Python step: the rows of `table` for the ctx's token ids [T] -> [T, d]."""
        self.tape.act(token_ids)
        out = self.tape.out((token_ids.shape[0], table.shape[1]))
        dev = self.dev
        self.tape.python(lambda: np.copyto(out, dev.embed(table, token_ids)))
        return out

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        tape = self.tape
        out = tape.out(x.shape)
        n = x.shape[-1]
        tape.node(ct.RmsNorm(x=tape.act(x), w=tape.pin(w), out=tape.act(out), rows=x.size // n, n=n, eps=eps))
        return out

    def linear(self, x: np.ndarray, w: FastWeight, b: np.ndarray | None = None) -> np.ndarray:
        return self.linears(x, (w,), (b,))[0]

    def linears(self, x: np.ndarray, ws: tuple[FastWeight, ...], bs: tuple[np.ndarray | None, ...]) -> list[np.ndarray]:
        """Each int8 group one Linears node (one rounding of x, one launch); other kernels a
        Python step into an owned output; biases a Bias node each."""
        tape = self.tape
        T, cols = x.shape
        x_at = tape.act(x)
        done: dict[int, np.ndarray] = {}  # index in ws -> its output [T, rows], a view of the group's
        for jobs, members in self.dev.int8_jobs(ws):
            w0 = jobs.weights[0]
            flat = tape.out((T * jobs.rows,))
            group = ci.rounding_group(w0)
            if ci.on_tiles(jobs, T):  # as the eager launch: AMX tiles, the same sums bit for bit
                assert jobs.amx is not None
                A, S, N, CS = (tape.pin(v) for v in amx_products.activations_for(T, cols, group))  # scratch
                tape.node(ct.AmxLinears(jobs=tape.pin(jobs.amx), njobs=len(jobs.amx), x=x_at, T=T, cols=cols,
                                        group=group, a=A, s=S, n=N, cs=CS, out=tape.act(flat), out_floats=flat.size))
            else:
                tape.node(ct.Linears(jobs=tape.pin(jobs.table), njobs=len(jobs.table), x=x_at, T=T, cols=cols,
                                     order=ci.activation_order(w0), group=group, nsteps=w0.nsteps,
                                     nchunks=w0.nchunks, out=tape.act(flat), out_floats=flat.size))
            for i, (lo, hi) in zip(members, jobs.bounds):
                done[i] = flat[T * lo : T * hi].reshape(T, hi - lo)
        outs: list[np.ndarray] = []
        for i, (w, b) in enumerate(zip(ws, bs)):
            out = done.get(i)
            if out is None:
                out = self._python_product(x, w)
            if b is not None:
                tape.node(ct.Bias(out=tape.act(out), b=tape.pin(b), T=T, n=out.shape[1]))
            outs.append(out)
        return outs

    def _python_product(self, x: np.ndarray, w: FastWeight) -> np.ndarray:
        """A Python step: x [T, cols] @ w.T by w's own kernel, into a new owned output [T, rows]."""
        out = self.tape.out((x.shape[0], w.shape[0]))
        self.tape.python(lambda: np.copyto(out, w.compute(x)))
        return out

    def rope(self, x: np.ndarray, ctx: FastRoundCtx, base: float, rope_dim: int, interleaved: bool,
             scaling: RopeScaling | None = None) -> np.ndarray:
        tape = self.tape
        cos, sin = self._rope_table(ctx, base, rope_dim, scaling)  # [T, rope_dim/2] each
        T, H, hd = x.shape
        out = tape.out(x.shape)
        tape.node(ct.Rope(x=tape.act(x), T=T, H=H, hd=hd, cos=tape.act(cos), sin=tape.act(sin), half=cos.shape[1],
                          interleaved=bool(interleaved), out=tape.act(out)))
        return out

    def _rope_table(self, ctx: FastRoundCtx, base: float, rope_dim: int,
                    scaling: RopeScaling | None) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [T, rope_dim/2] of the ctx's positions, one RopeTable node per key."""
        key = rope_key(base, rope_dim, scaling)
        table = self._rope.get(key)
        if table is None:
            tape = self.tape
            inv_freq, mscale = rope_inv_freq(*key)
            inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float32)  # [half]
            T, half = ctx.positions.shape[0], inv_freq.shape[0]
            cos, sin = tape.out((T, half)), tape.out((T, half))
            tape.node(ct.RopeTable(positions=tape.act(ctx.positions), T=T, inv_freq=tape.pin(inv_freq), half=half,
                                   cos=tape.act(cos), sin=tape.act(sin), mscale=float(mscale)))
            table = self._rope[key] = (cos, sin)
        return table

    def write_kv(self, kv: CpuKV, layer: int, k: np.ndarray, v: np.ndarray, ctx: FastRoundCtx) -> None:
        tape = self.tape
        for pool, x in ((kv.k[layer], k), (kv.v[layer], v)):
            tape.node(ct.StoreKv(pool=tape.pin(pool), width=pool[0].size, slots=tape.act(ctx.slots), T=x.shape[0],
                                 x=tape.act(x), f16=pool.dtype == np.float16, nslots=pool.shape[0]))

    def attention(self, q: np.ndarray, kv: CpuKV, layer: int, ctx: FastRoundCtx, scale: float,
                  window: int) -> np.ndarray:
        """Every row through the paged kernel: row i is sequence i, its table row i of the buffers'."""
        tape, b = self.tape, self.buffers
        T, H, hd = q.shape
        kp, vp = kv.k[layer], kv.v[layer]
        out = tape.out(q.shape)
        tape.node(ct.Attention(q=tape.act(q), T=T, H=H, hd=hd, k_pool=tape.pin(kp), v_pool=tape.pin(vp),
                               nslots=kp.shape[0], Hkv=kp.shape[1], f16=kp.dtype == np.float16, rows=tape.act(b.rows),
                               nrows=b.S, positions=tape.act(ctx.positions), row_seq=tape.act(b.rows),
                               tables=tape.act(b.tables), S=b.S, B=b.width, block_size=kv.block_size, scale=scale,
                               window=int(window), out=tape.act(out), gemm=gemm_ir.compiled_address()))
        return out

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        tape = self.tape
        out = tape.out(gate.shape)
        tape.node(ct.Glu(gate=tape.act(gate), up=tape.act(up), T=gate.shape[0], n=gate.shape[1], gelu=act != "silu",
                         out=tape.act(out)))
        return out

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if x.shape != y.shape:
            raise NotRecordable(f"a broadcasting add {x.shape} + {y.shape}")
        tape = self.tape
        out = tape.out(x.shape)
        tape.node(ct.Add(x=tape.act(x), y=tape.act(y), out=tape.act(out), n=x.size))
        return out

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        tape = self.tape
        out = tape.out(x.shape)
        tape.node(ct.Scale(x=tape.act(x), s=s, out=tape.act(out), n=x.size))
        return out

    def take_rows(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        tape = self.tape
        d = x.shape[1]
        out = tape.out((rows.shape[0], d))
        tape.node(ct.TakeRows(x=tape.act(x), rows=tape.act(rows), S=rows.shape[0], d=d, out=tape.act(out)))
        return out

    def from_numpy(self, x: np.ndarray) -> np.ndarray:
        raise NotRecordable(f"a host array of shape {x.shape}: a replay would freeze its value")
