"""The scheduler actor: a thin I/O loop around SchedulerCore (actors/scheduler_core.py).

It receives admissions, aborts, sampled tokens and failed rounds on its inbox and hands each
to the core; then, while no round is in flight, it asks the core for the next step and does
what it says: call the drafter (a draft model's actor) or the KV actor (and feed the reply back),
send the round to the executor, or send outputs and stats to the front door. Tracing spans
(queue, schedule) and logs live here.
"""

from __future__ import annotations

import time

import structlog
import trio
import zmq
from opentelemetry.trace import Span

from zinfer.actors.draft_actor import DraftClient, drafter_address
from zinfer.actors.kv_actor import KvClient
from zinfer.actors.scheduler_core import RoundPlan, SchedulerCore
from zinfer.actors.scheduler_policy import SchedulerConfig, SchedulerPolicy
from zinfer.actors.topology import Addresses
from zinfer.messages.channel import Inbox, Outbox
from zinfer.messages.engine import (
    Abort,
    ActorFailed,
    Admit,
    DraftAsk,
    ExecutorInbox,
    KvUpdate,
    RoundFailed,
    Sampled,
    SchedulerInbox,
    SeqOutputs,
    Shutdown,
    FrontDoorInbox,
)
from zinfer.traces.config import QUEUE, SCHEDULE
from zinfer.traces.setup import Tracing

log = structlog.get_logger("zinfer.scheduler")


class SchedulerActor:
    """device_reductions: each round tells the executor what the sampler needs of each
    logits row (actors/logits_need.py), so greedy and top-k rows leave the device as a few
    candidates; False ships every row whole (the same tokens, more bytes)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses, config: SchedulerConfig,
                 tracing: Tracing | None = None, device_reductions: bool = True):
        self.core = SchedulerCore(config, device_reductions, kv_traceparents=tracing is not None)
        self.inbox: Inbox[SchedulerInbox] = Inbox(ctx, addrs.scheduler, SchedulerInbox)
        self.to_front_door: Outbox[FrontDoorInbox] = Outbox(ctx, addrs.front_door, FrontDoorInbox)
        self.to_executor: Outbox[ExecutorInbox] = Outbox(ctx, addrs.executor, ExecutorInbox)
        self.kv = KvClient(ctx, addrs.kv)
        # the draft model's actor, when the engine has one (speculative decoding with --draft-model)
        self.drafter = DraftClient(ctx, drafter_address(addrs)) if config.speculation.draft_model else None
        self.tracing = tracing  # None: tracing off
        self.queue_spans: dict[int, Span] = {}  # seq_id -> its open "queue" span

    @property
    def policy(self) -> SchedulerPolicy:
        """The core's sequences and round planning (read by tests and tools)."""
        return self.core.policy

    @property
    def preemptions(self) -> int:
        return self.core.preemptions

    @property
    def round_id(self) -> int:
        """The rounds started so far."""
        return self.core.round_id

    @property
    def device_reductions(self) -> bool:
        return self.core.device_reductions

    @device_reductions.setter
    def device_reductions(self, on: bool) -> None:
        self.core.device_reductions = on

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                msg = await self.inbox.recv()
                if isinstance(msg, Shutdown):
                    await self.kv.shutdown()
                    if self.drafter is not None:
                        await self.drafter.shutdown()
                    return
                await self.handle(msg)
                if self.core.in_flight is None:
                    await self.start_round()
        finally:
            for end in (self.inbox, self.to_front_door, self.to_executor, self.kv, self.drafter):
                if end is not None:
                    end.close()

    async def handle(self, msg: Admit | Abort | Sampled | RoundFailed | ActorFailed) -> None:
        if isinstance(msg, Admit):
            rejected = self.core.admit(msg)
            if rejected is not None:
                await self.to_front_door.send(rejected)
            elif self.tracing is not None:
                attrs = {"seq_id": msg.seq_id, "prompt_tokens": len(msg.prompt_ids), "zinfer.actor": "scheduler"}
                self.queue_spans[msg.seq_id] = self.tracing.start(QUEUE, msg.traceparent, attrs)
        elif isinstance(msg, Abort):
            self.core.abort(msg.seq_id)
            span = self.queue_spans.pop(msg.seq_id, None)
            if span is not None:
                span.end()  # aborted while queued
        elif isinstance(msg, Sampled):
            outputs = self.core.update(msg)
            if outputs is not None:
                await self.to_front_door.send(outputs)
        elif isinstance(msg, RoundFailed):
            outputs = self.core.fail_round(msg)
            seq_ids = [o.seq_id for o in outputs.outputs]
            log.warning("round failed", round_id=msg.round_id, seq_ids=seq_ids, error=msg.message)
            await self.to_front_door.send(outputs)
        elif isinstance(msg, ActorFailed):
            await self.to_front_door.send(msg)

    async def start_round(self) -> None:
        """Step the core to its next round (calling the KV actor as it asks), and send what it gives."""
        t0 = time.time_ns()
        step = self.core.schedule()
        while isinstance(step, (KvUpdate, DraftAsk)):
            if isinstance(step, DraftAsk):
                assert self.drafter is not None  # the core asks only when there is one
                drafted = await self.drafter.call(step)
                if drafted.error:
                    log.warning("draft failed", seq_ids=[s.seq_id for s in step.seqs], error=drafted.error)
                self.core.drafted(drafted)
                step = self.core.schedule()
                continue
            reply = await self.kv.call(step)
            preempted = self.core.granted(reply)
            if preempted:
                log.info("preempted", seq_ids=preempted, kv_used=reply.stats.used_blocks)
            step = self.core.schedule()
        if isinstance(step, RoundPlan):
            await self.to_executor.send(step.round)
            if self.tracing is not None:
                self._trace_round(self.tracing, t0, step)
        elif isinstance(step, SeqOutputs):
            await self.to_front_door.send(step)

    def _trace_round(self, tracing: Tracing, t0: int, plan: RoundPlan) -> None:
        """End the queue spans of the round's newcomers; record the planning as a span."""
        for c in plan.chunks:
            span = self.queue_spans.pop(c.seq.seq_id, None)
            if span is not None:
                span.set_attribute("cached_tokens", c.seq.cached_tokens)
                span.end(end_time=t0)
        core, kv, parents = self.core, self.core.kv_stats, plan.round.traceparents
        attrs = {
            "round_id": core.round_id,
            "batch_size": len(plan.chunks),
            "tokens": sum(len(s.token_ids) for s in plan.round.seqs),
            "seq_ids": [c.seq.seq_id for c in plan.chunks],
            "new_seq_ids": [c.seq.seq_id for c in plan.chunks if c.new],
            "waiting": len(core.policy.waiting),
            "kv_used_blocks": kv.used_blocks,
            "kv_free_blocks": kv.num_blocks - kv.used_blocks,
            "preemptions": core.preemptions,
            "drafted_tokens": sum(len(c.draft) for c in plan.chunks),
            "zinfer.actor": "scheduler",
        }
        tracing.record(SCHEDULE, parents[0] if parents else None, attrs, parents, t0)
        drafted = [c for c in plan.chunks if c.draft]
        if drafted:  # speculative decoding: the drafts this round verifies, planned with it
            draft_parents = [c.seq.traceparent for c in drafted if c.seq.traceparent]
            draft_attrs = {
                "round_id": core.round_id,
                "seq_ids": [c.seq.seq_id for c in drafted],
                "drafted_tokens": [len(c.draft) for c in drafted],
                "zinfer.actor": "scheduler",
            }
            tracing.record("draft", draft_parents[0] if draft_parents else None, draft_attrs, draft_parents, t0)
