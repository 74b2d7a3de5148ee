"""The executor actor: owns one device's weights and KV storage and runs rounds.

Each round runs in a worker thread (numpy and cupy release the GIL), so the other
actors of an in-process topology keep streaming while it computes: the device's
run_round over the forward (devices/round.py tells the whole round), traced or not, so
CUDA graphs and device-time kernel spans are on the normal path. Only what the sampler
needs of the logits leaves the device: full rows, or the top candidates of greedy and
top-k rows (devices/reductions.py).

A round that raises (a kernel fault, a device error) fails that round's requests, not the
engine: the executor tells the scheduler (RoundFailed), which ends each of the round's
sequences with the error and frees its KV, and the next round runs as usual.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np
import structlog
import trio
import zmq

from zinfer.actors.topology import Addresses
from zinfer.devices.base import Device
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.reductions import reduce_rows
from zinfer.messages.channel import Inbox, Outbox
from zinfer.messages.engine import (
    Candidates,
    Draft,
    ExecutorInbox,
    Round,
    RoundFailed,
    RoundLogits,
    RoundSeq,
    SamplerInbox,
    SchedulerInbox,
    Shutdown,
)
from zinfer.models.forward import LayerMarks, round_layers
from zinfer.models.loader import ModelSource
from zinfer.models.weight_cache import build_device_weights
from zinfer.traces.rounds import RoundTracer
from zinfer.traces.setup import Tracing

log = structlog.get_logger("zinfer.executor")

ShippedLogits = tuple[list[int], np.ndarray, Candidates | None]  # (full rows' seq ids, those rows, the candidates)


class ExecutorActor:
    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        addrs: Addresses,
        source: ModelSource,
        device: Device,
        num_blocks: int,
        block_size: int,
        tracing: Tracing | None = None,
    ):
        spec = source.spec
        started = time.perf_counter()
        self.spec, self.device, self.block_size = spec, device, block_size
        # repacked weights from the disk cache where there is one; copied file pages leave RSS
        self.weights = build_device_weights(source, device)
        self.kv = device.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, num_blocks, block_size)
        log.info("executor ready", device=device.name, seconds=round(time.perf_counter() - started, 2))
        self.inbox: Inbox[ExecutorInbox] = Inbox(ctx, addrs.executor, ExecutorInbox)
        self.to_sampler: Outbox[SamplerInbox] = Outbox(ctx, addrs.sampler, SamplerInbox)
        self.to_scheduler: Outbox[SchedulerInbox] = Outbox(ctx, addrs.scheduler, SchedulerInbox)  # failed rounds only
        self.failed_rounds = 0
        self.busy_seconds = 0.0  # time inside rounds, for the bus-overhead figure
        # None: tracing off
        self.round_tracer = RoundTracer(tracing, device, device.kernel_clock()) if tracing is not None else None
        self.tables = BlockTables()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                msg = await self.inbox.recv()
                if isinstance(msg, Shutdown):
                    await self.to_sampler.send(msg)
                    return
                try:
                    logits = await self.run_round(msg)
                except Exception as e:  # this round's requests fail; the engine serves on
                    await self.to_scheduler.send(RoundFailed(msg.round_id, self._failure(msg, e)))
                    continue
                await self.to_sampler.send(logits)
        finally:
            self.close()

    def close(self) -> None:
        """Close the actor's sockets (run() does on its way out): a zmq context can then end."""
        for end in (self.inbox, self.to_sampler, self.to_scheduler):
            end.close()

    def _failure(self, r: Round, e: Exception) -> str:
        """The one-line reason round r failed, logged (the first failure with its traceback)."""
        self.failed_rounds += 1
        message = f"the device failed this round: {type(e).__name__}: {_first_line(e)}"
        log.error(
            "round failed",
            round_id=r.round_id,
            seq_ids=[s.seq_id for s in r.seqs],
            error=message,
            exc_info=self.failed_rounds == 1,
        )
        return message

    async def run_round(self, r: Round) -> RoundLogits:
        tables = self.tables.update(r)
        chunks = [(s.token_ids, s.start_pos, t, s.wants_logits) for s, t in zip(r.seqs, tables)]
        batch = drafted_rows(ForwardBatch.build(chunks, self.block_size), r.seqs)
        wanting = [s for s in r.seqs if s.wants_logits for _ in range(s.draft + 1)]  # one per logits row
        q = {d.seq_id: d.probs for d in r.drafts}  # a draft model's proposal distributions, handed on
        drafts = [Draft(s.seq_id, s.token_ids[len(s.token_ids) - s.draft :], q.get(s.seq_id))
                  for s in r.seqs if s.draft]
        t0 = time.perf_counter()
        if self.round_tracer is None:
            seq_ids, logits, candidates = await trio.to_thread.run_sync(self.compute, batch, wanting)
        else:
            rt = self.round_tracer
            seq_ids, logits, candidates = await trio.to_thread.run_sync(rt.run, self.compute, batch, wanting)
            rt.finish(round_name(r), round_attributes(r, batch), r.traceparents)
        self.busy_seconds += time.perf_counter() - t0
        return RoundLogits(r.round_id, seq_ids, logits, r.sampler_updates, r.traceparents, candidates, drafts)

    def compute(self, batch: ForwardBatch, wanting: list[RoundSeq], marks: LayerMarks | None = None) -> ShippedLogits:
        """One round on the device (worker thread), its logits cut on the device to what the
        sampler needs of each of wanting's rows (devices/reductions.py): (seq ids of the full
        rows, those rows [S_full, vocab] on the host, the others' candidates or None). With
        tracing, the forward runs on the kernel-timing wrapper and marks its layers."""
        dev = self.device if self.round_tracer is None else self.round_tracer.device
        logits = dev.run_round(round_layers(self.spec, self.weights, self.kv, marks), batch, self.kv)
        return reduce_logits(self.device, logits, wanting)


def reduce_logits(device: Any, logits: Any, seqs: Sequence[RoundSeq]) -> ShippedLogits:
    """Cut logits [S, vocab] (the device's array, one row per seq of seqs) by each seq's
    logits_need (devices/reductions.py): (seq ids of the full rows, those rows [S_full,
    vocab] float32 numpy, the candidates of the rest or None). Reads logits only."""
    r = reduce_rows(device, logits, [s.logits_need for s in seqs])
    top = r.top
    candidates = None
    if top is not None:
        candidates = Candidates([seqs[i].seq_id for i in top.rows], top.ids, top.values, top.row_max)
    return [seqs[i].seq_id for i in r.full], r.full_logits, candidates


def drafted_rows(batch: ForwardBatch, seqs: Sequence[RoundSeq]) -> ForwardBatch:
    """batch with logits at the last draft + 1 rows of each drafted sequence of seqs (its
    chunks, in order): speculative decoding verifies a draft from the logits after each of its
    tokens. A round without drafts comes back as it is."""
    if not any(s.draft for s in seqs):
        return batch
    rows: list[int] = []
    for s, c in zip(seqs, batch.seqs):
        if s.wants_logits:
            if not 0 <= s.draft < c.n_tokens:
                raise ValueError(f"seq {s.seq_id}: a draft of {s.draft} in a chunk of {c.n_tokens} tokens")
            rows.extend(range(c.start + c.n_tokens - 1 - s.draft, c.start + c.n_tokens))
    return dataclasses.replace(batch, logits_rows=np.asarray(rows, dtype=np.int64))  # [S + drafts]


class BlockTables:
    """The executor's copy of each sequence's block table, kept from the rounds' deltas.

    A Round first drops the tables of its `forget` ids (finished, aborted, preempted), then
    each RoundSeq cuts its sequence's table to table_start entries and appends new_blocks,
    so the executor holds tables only for sequences the scheduler still runs.
    """

    def __init__(self) -> None:
        self._tables: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._tables)

    def seq_ids(self) -> set[int]:
        """The sequences whose tables are kept."""
        return set(self._tables)

    def update(self, r: Round) -> list[list[int]]:
        """Apply r's deltas; return the full table of each of r.seqs, in order (the kept
        lists themselves: read them only). Raises ValueError when a delta starts past the
        table it extends."""
        for seq_id in r.forget:
            self._tables.pop(seq_id, None)
        out = []
        for s in r.seqs:
            table = self._tables.setdefault(s.seq_id, [])
            if s.table_start > len(table):
                raise ValueError(
                    f"seq {s.seq_id}: block table delta starts at {s.table_start}, the table has {len(table)}")
            del table[s.table_start :]
            table.extend(s.new_blocks)
            out.append(table)
        return out


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else "(no message)"


def round_name(r: Round) -> str:
    """What the round did: prefill (from position 0), append (a later prompt chunk) and
    decode (one token), joined with '+' when it mixes them."""
    kinds = {"prefill" if s.start_pos == 0 else "decode" if len(s.token_ids) == 1 else
             "verify" if s.draft else "append" for s in r.seqs}
    return "+".join(k for k in ("prefill", "append", "decode", "verify") if k in kinds)


def round_attributes(r: Round, batch: ForwardBatch) -> dict[str, object]:
    """The round span's attributes: batch size, token counts, sequence ids, KV blocks."""
    return {
        "round_id": r.round_id,
        "batch_size": len(r.seqs),
        "tokens": batch.n_tokens,
        "seq_ids": [s.seq_id for s in r.seqs],
        "seq_tokens": [len(s.token_ids) for s in r.seqs],
        "context_tokens": sum(s.start_pos + len(s.token_ids) for s in r.seqs),
        "kv_blocks": sum(s.table_start + len(s.new_blocks) for s in r.seqs),
        "logits_rows": len(batch.logits_rows),
        "drafted_tokens": sum(s.draft for s in r.seqs),
    }
