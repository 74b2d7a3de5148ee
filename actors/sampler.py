"""The sampler actor: turns each round's logits into tokens, per request parameters.

Per-sequence state (seeded generator, penalty counts) arrives as sampler updates that
ride along with the round, so it is always in place before the logits that need it.
"""

from __future__ import annotations

import time

import structlog
import trio
import zmq

from zinfer.actors.sampling import RequestSampler
from zinfer.actors.topology import Addresses
from zinfer.messages.channel import Inbox, Outbox
from zinfer.messages.engine import RoundLogits, SamplerAdd, SamplerInbox, Sampled, SchedulerInbox, Shutdown, TokenSample

log = structlog.get_logger("zinfer.sampler")


class SamplerActor:
    def __init__(self, ctx: zmq.Context, addrs: Addresses, vocab_size: int, tracing=None):
        self.vocab_size = vocab_size
        self.tracing = tracing  # None: tracing off
        self.samplers: dict[int, RequestSampler] = {}
        self.inbox: Inbox = Inbox(ctx, addrs.sampler, SamplerInbox)
        self.to_scheduler: Outbox = Outbox(ctx, addrs.scheduler, SchedulerInbox)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                msg = await self.inbox.recv()
                if isinstance(msg, Shutdown):
                    return
                t0 = time.time_ns()
                sampled = self.sample_round(msg)
                if self.tracing is not None and msg.traceparents:
                    attrs = {"sampled_round": msg.round_id, "rows": len(msg.seq_ids), "seq_ids": msg.seq_ids}
                    self.tracing.record("sample", msg.traceparents[0], attrs, msg.traceparents[1:], t0)
                await self.to_scheduler.send(sampled)
        finally:
            self.inbox.close()
            self.to_scheduler.close()

    def sample_round(self, msg: RoundLogits) -> Sampled:
        """Apply the round's sampler updates, then sample one token per logits row."""
        for u in msg.sampler_updates:
            if isinstance(u, SamplerAdd):
                self.samplers[u.seq_id] = RequestSampler(u.params, u.prompt_ids, self.vocab_size)
            else:
                self.samplers.pop(u.seq_id, None)
        tokens = []
        for row, seq_id in enumerate(msg.seq_ids):
            sampler = self.samplers[seq_id]
            s = sampler.sample(msg.logits[row])  # [vocab]
            sampler.accept(s.token_id)
            tokens.append(TokenSample(seq_id, s.token_id, s.logprob, s.top_logprobs))
        return Sampled(msg.round_id, tokens)
