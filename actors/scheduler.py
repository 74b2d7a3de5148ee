"""The scheduler actor: a thin I/O loop around SchedulerPolicy.

It receives admissions, aborts and sampled tokens on its inbox; asks the KV actor for
blocks when a round needs some (or frees and commits are pending: a decode step inside
its last block needs no call); sends the round to the executor and each round's new
tokens to the tokenizer. One round is in flight at a time: the next is planned when the
sampled tokens of the last come back (or the executor says it failed: RoundFailed ends
that round's sequences with the error), so admissions and aborts that arrive meanwhile
join the next round.
"""

from __future__ import annotations

import time

import structlog
import trio
import zmq
from opentelemetry.trace import Span

from zinfer.actors.kv import KvClient
from zinfer.actors.logits_need import logits_needed
from zinfer.actors.scheduler_policy import Chunk, SchedulerConfig, SchedulerPolicy, Seq
from zinfer.actors.topology import Addresses
from zinfer.messages.channel import Inbox, Outbox
from zinfer.messages.engine import (
    Abort,
    ActorFailed,
    Admit,
    ExecutorInbox,
    KvCommit,
    KvGrant,
    KvStats,
    KvUpdate,
    Round,
    RoundFailed,
    SamplerAdd,
    SamplerDrop,
    SamplerUpdate,
    Sampled,
    SchedulerInbox,
    SchedulerStats,
    SeqOutput,
    SeqOutputs,
    SeqRejected,
    Shutdown,
    TokenizerInbox,
    TokenSample,
)
from zinfer.traces.config import QUEUE, SCHEDULE
from zinfer.traces.setup import Tracing

log = structlog.get_logger("zinfer.scheduler")


class SchedulerActor:
    """device_reductions: each round tells the executor what the sampler needs of each
    logits row (actors/logits_need.py), so greedy and top-k rows leave the device as a few
    candidates; False ships every row whole (the same tokens, more bytes)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses, config: SchedulerConfig, tracing: Tracing | None = None, device_reductions: bool = True):
        config.validate()
        self.device_reductions = device_reductions
        self.policy = SchedulerPolicy(config)
        self.inbox: Inbox[SchedulerInbox] = Inbox(ctx, addrs.scheduler, SchedulerInbox)
        self.to_tokenizer: Outbox[TokenizerInbox] = Outbox(ctx, addrs.tokenizer, TokenizerInbox)
        self.to_executor: Outbox[ExecutorInbox] = Outbox(ctx, addrs.executor, ExecutorInbox)
        self.kv = KvClient(ctx, addrs.kv)
        self.kv_stats = KvStats(config.num_blocks, 0, 0)
        self.round_id = 0
        self.preemptions = 0
        self.in_flight: list[Chunk] | None = None
        self.in_flight_updates: list[SamplerUpdate] = []  # the sampler updates the in-flight round carries
        self.frees: list[int] = []
        self.commits: list[KvCommit] = []
        self.forget: list[int] = []  # seq ids whose block tables the executor may drop
        self.sampler_updates: list[SamplerUpdate] = []
        self.tracing = tracing  # None: tracing off
        self.queue_spans: dict[int, Span] = {}  # seq_id -> its open "queue" span

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                msg = await self.inbox.recv()
                if isinstance(msg, Shutdown):
                    await self.kv.shutdown()
                    return
                await self.handle(msg)
                if self.in_flight is None:
                    await self.start_round()
        finally:
            for end in (self.inbox, self.to_tokenizer, self.to_executor, self.kv):
                end.close()

    async def handle(self, msg: Admit | Abort | Sampled | RoundFailed | ActorFailed) -> None:
        if isinstance(msg, Admit):
            seq = Seq(msg.seq_id, list(msg.prompt_ids), msg.params, frozenset(msg.eos_ids), msg.traceparent)
            rejection = self.policy.add(seq)
            if rejection:
                await self.to_tokenizer.send(SeqRejected(msg.seq_id, *rejection))
            else:
                self.sampler_updates.append(SamplerAdd(msg.seq_id, msg.params, list(msg.prompt_ids)))
                if self.tracing is not None:
                    attrs = {"seq_id": msg.seq_id, "prompt_tokens": len(msg.prompt_ids), "zinfer.actor": "scheduler"}
                    self.queue_spans[msg.seq_id] = self.tracing.start(QUEUE, msg.traceparent, attrs)
        elif isinstance(msg, Abort):
            if self.policy.abort(msg.seq_id) is not None:
                self._release(msg.seq_id)
        elif isinstance(msg, Sampled):
            await self._complete(msg)
        elif isinstance(msg, RoundFailed):
            await self._fail_round(msg)
        elif isinstance(msg, ActorFailed):
            await self.to_tokenizer.send(msg)

    def _release(self, seq_id: int) -> None:
        """A sequence ended: queue the freeing of its KV, sampler state and executor table."""
        self.frees.append(seq_id)
        self.forget.append(seq_id)
        self.sampler_updates.append(SamplerDrop(seq_id))
        if self.tracing is not None and seq_id in self.queue_spans:
            self.queue_spans.pop(seq_id).end()  # aborted while queued

    async def start_round(self) -> None:
        """Plan a round, get its KV blocks (preempting if they run out), send it."""
        t0 = time.time_ns()
        while True:
            chunks = self.policy.plan()
            if not chunks and not (self.frees or self.commits):
                return
            if self.frees or self.commits or not self.policy.kv_covered(chunks):
                grants = await self._kv_update(chunks)
            else:  # a decode inside its blocks: the allocator has nothing to do
                grants = [KvGrant(c.seq.seq_id, True, c.seq.block_table) for c in chunks]
            accepted, victims = self.policy.accept(chunks, grants)
            if victims:
                self.frees = [v.seq_id for v in victims]
                self.forget += self.frees
                self.preemptions += len(victims)
                log.info("preempted", seq_ids=self.frees, kv_used=self.kv_stats.used_blocks)
                continue
            if accepted:
                break
            if any(c.new and c.seq in self.policy.running for c in chunks):
                continue  # admitted with a cached prefix longer than its chunk: plan its rest
            await self.to_tokenizer.send(SeqOutputs([], self.stats()))  # idle: report the freed blocks
            return
        self.round_id += 1
        seqs = self.policy.round_seqs(accepted)
        if self.device_reductions:
            for s, c in zip(seqs, accepted):
                s.logits_need = logits_needed(c.seq.params) if s.wants_logits else 0
        parents = [c.seq.traceparent for c in accepted if c.seq.traceparent]
        await self.to_executor.send(Round(self.round_id, seqs, self.sampler_updates, parents, self.forget))
        self.in_flight_updates, self.sampler_updates, self.forget = self.sampler_updates, [], []
        self.in_flight = accepted
        if self.tracing is not None:
            self._trace_round(t0, accepted, parents)

    async def _kv_update(self, chunks: list[Chunk]) -> list[KvGrant]:
        """Send the pending frees and commits and the chunks' block asks to the KV actor."""
        parents = [c.seq.traceparent for c in chunks if c.seq.traceparent] if self.tracing is not None else []
        update = KvUpdate(self.frees, self.commits, self.policy.kv_asks(chunks), parents)
        self.frees, self.commits = [], []
        reply = await self.kv.call(update)
        self.kv_stats = reply.stats
        return reply.grants

    def _trace_round(self, t0: int, accepted: list[Chunk], parents: list[str]) -> None:
        """End the queue spans of the round's newcomers; record the planning as a span."""
        assert self.tracing is not None  # called only while tracing
        for c in accepted:
            span = self.queue_spans.pop(c.seq.seq_id, None)
            if span is not None:
                span.set_attribute("cached_tokens", c.seq.cached_tokens)
                span.end(end_time=t0)
        attrs = {
            "round_id": self.round_id,
            "batch_size": len(accepted),
            "tokens": sum(c.end - c.seq.num_computed for c in accepted),
            "seq_ids": [c.seq.seq_id for c in accepted],
            "new_seq_ids": [c.seq.seq_id for c in accepted if c.new],
            "waiting": len(self.policy.waiting),
            "kv_used_blocks": self.kv_stats.used_blocks,
            "kv_free_blocks": self.kv_stats.num_blocks - self.kv_stats.used_blocks,
            "preemptions": self.preemptions,
            "zinfer.actor": "scheduler",
        }
        self.tracing.record(SCHEDULE, parents[0] if parents else None, attrs, parents, t0)

    async def _complete(self, msg: Sampled) -> None:
        """A round's samples came back: end the sequences whose sampling failed (theirs
        alone: KV, sampler state and table freed, an "error:" finish sent), advance the rest."""
        chunks, self.in_flight = self.in_flight or [], None
        samples: dict[int, TokenSample] = {}
        failed: list[SeqOutput] = []
        t: TokenSample | None  # each sample below, then each chunk's (None: it has none)
        for t in msg.tokens:
            if t.error is None:
                samples[t.seq_id] = t
            elif self.policy.abort(t.seq_id) is not None:
                self._release(t.seq_id)
                failed.append(SeqOutput(t.seq_id, [], None, finish_reason=f"error:{t.error}"))
        commits, finished = self.policy.complete(chunks, {k: t.token_id for k, t in samples.items()})
        self.commits += commits
        reasons = {f.seq.seq_id: f.reason for f in finished}
        outputs = failed
        for c in chunks:
            t = samples.get(c.seq.seq_id)
            if t is None or (c.seq not in self.policy.running and c.seq.seq_id not in reasons):
                continue  # mid-prefill, or aborted while the round ran
            logprobs = [t.logprob] if t.logprob is not None else None
            top = [t.top] if t.top is not None else None
            reason = reasons.get(c.seq.seq_id)
            outputs.append(SeqOutput(c.seq.seq_id, [t.token_id], logprobs, top, reason, c.seq.cached_tokens))
        for seq_id in reasons:
            self._release(seq_id)
        if outputs:
            await self.to_tokenizer.send(SeqOutputs(outputs, self.stats()))

    async def _fail_round(self, msg: RoundFailed) -> None:
        """The executor could not compute the in-flight round: end each of its sequences
        with the error (KV, sampler state and table freed, as a failed sample does). The
        round's sampler updates go out again with the next round, so the sampler's state
        stays that of the scheduler (an add of a failed sequence is dropped right after)."""
        chunks, self.in_flight = self.in_flight or [], None
        self.sampler_updates = self.in_flight_updates + self.sampler_updates
        self.in_flight_updates = []
        failed = []
        for c in chunks:
            if self.policy.abort(c.seq.seq_id) is not None:  # None: aborted while the round ran
                self._release(c.seq.seq_id)
                failed.append(SeqOutput(c.seq.seq_id, [], None, finish_reason=f"error:{msg.message}"))
        log.warning("round failed", round_id=msg.round_id, seq_ids=[o.seq_id for o in failed], error=msg.message)
        await self.to_tokenizer.send(SeqOutputs(failed, self.stats()))

    def stats(self) -> SchedulerStats:
        p, kv = self.policy, self.kv_stats
        return SchedulerStats(len(p.running), len(p.waiting), kv.num_blocks, kv.used_blocks, kv.cached_blocks, self.round_id)
