"""The drafter actor: a draft model's executor for speculative decoding (`--draft-model`).

Like the target's executor it owns a device instance, the draft model's weights and its own KV
pool, and runs rounds in a worker thread; unlike it, it answers the scheduler directly
(request/reply over a ROUTER, as the KV actor does): before the scheduler plans a round it asks
for drafts (DraftAsk), and each reply (DraftReply) carries one proposal per sequence. What a
proposal is and how the pool follows the target's accepted tokens: actors/draft_model.py.

Its rounds are spans of their own ("draft_append": catch-up chunks, "draft_decode": one-row
steps; actor "drafter"), under the first request of the ask, so a trace tells them from the
target's prefill / decode / verify rounds. A round that raises fails the ask alone: the reply
carries the error, every asked sequence is dropped and decodes without a draft this round.
"""

from __future__ import annotations

import time

import numpy as np
import structlog
import trio
import zmq

from zinfer.actors.draft_head import cut_head, head_ids
from zinfer.actors.draft_model import Chunk, DraftModel
from zinfer.actors.draft_vocab import check_same_vocab
from zinfer.actors.topology import Addresses
from zinfer.devices.base import Device
from zinfer.devices.batch import ForwardBatch
from zinfer.actors.request_client import RequestClient
from zinfer.messages.bus import AsyncSocket
from zinfer.messages.codec import Codec
from zinfer.messages.engine import DraftAsk, DrafterInbox, DraftReply, Shutdown
from zinfer.models.forward import round_layers
from zinfer.models.loader import ModelSource
from zinfer.models.prompt import PromptBuilder
from zinfer.models.weight_cache import build_device_weights
from zinfer.traces.setup import Tracing

log = structlog.get_logger("zinfer.drafter")


def drafter_address(addrs: Addresses) -> str:
    """The drafter's endpoint: beside the executor's (inproc and ipc topologies)."""
    return addrs.executor + "-drafter"


class DrafterActor:
    """target: the target model (its tokenizer is compared with the draft's: VocabMismatch
    refuses a draft model with another vocabulary before any weight loads). num_blocks: the
    draft pool's blocks of block_size tokens. token_budget: tokens per catch-up round.
    p_min: a proposal stops before the token that brings the product of its tokens' probabilities
    under it (actors/draft_model.py). head: the draft's LM
    head keeps the first this many ids and the end-of-generation ids (actors/draft_head.py; 0: all)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, target: ModelSource, draft: ModelSource,
                 device: Device, num_blocks: int, block_size: int, token_budget: int, p_min: float,
                 head: int = 0, tracing: Tracing | None = None):
        target_tok, draft_tok = PromptBuilder.from_source(target).tokenizer, PromptBuilder.from_source(draft).tokenizer
        vocab = check_same_vocab(target_tok, draft_tok, target.spec.vocab_size, draft.spec.vocab_size)
        started = time.perf_counter()
        spec = draft.spec
        self.spec, self.device, self.block_size = spec, device, block_size
        self.weights = build_device_weights(draft, device)
        ids = head_ids(vocab, head, draft_tok.eos_ids)  # [H] or None
        if ids is not None:
            self.weights.output = cut_head(draft.tensors, device.upload, ids)
        self.kv = device.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, num_blocks, block_size)
        self.model = DraftModel(num_blocks, block_size, vocab, spec.context_length, p_min, token_budget, ids)
        log.info("drafter ready", model=draft.name, device=device.name,
                 head_ids=vocab if ids is None else int(ids.size),
                 seconds=round(time.perf_counter() - started, 2))
        self.tracing = tracing  # None: tracing off
        self.rounds: list[tuple[str, int, int, dict[str, object]]] = []  # (name, start ns, end ns, attrs) to trace
        self.failed_asks = 0
        self.busy_seconds = 0.0
        self.sock = AsyncSocket(ctx, zmq.ROUTER, bind=address)
        self.inbox: Codec[DrafterInbox] = Codec(DrafterInbox)
        self.outbox: Codec[DraftReply] = Codec(DraftReply)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                peer, *frames = await self.sock.recv()
                msg = self.inbox.decode(frames)
                if isinstance(msg, Shutdown):
                    return
                reply = await trio.to_thread.run_sync(self.propose, msg)
                self._trace(msg)
                await self.sock.send([peer, *self.outbox.encode(reply)])
        finally:
            self.sock.close()

    def propose(self, ask: DraftAsk) -> DraftReply:
        """The ask's proposals (worker thread). A failed round drops the asked sequences and
        answers with the error."""
        t0 = time.perf_counter()
        try:
            return self.model.propose(ask, self._run)
        except Exception as e:
            self.failed_asks += 1
            for s in ask.seqs:
                self.model.forget(s.seq_id)
            message = f"the draft model failed: {type(e).__name__}: {str(e).strip()[:200]}"
            log.error("draft failed", seq_ids=[s.seq_id for s in ask.seqs], error=message,
                      exc_info=self.failed_asks == 1)
            return DraftReply([], error=message)
        finally:
            self.busy_seconds += time.perf_counter() - t0

    def _run(self, chunks: list[Chunk], kind: str) -> np.ndarray:
        """One draft round: logits [rows, vocab] on the host."""
        t0 = time.time_ns()
        batch = ForwardBatch.build(chunks, self.block_size)
        logits = self.device.run_round(round_layers(self.spec, self.weights, self.kv), batch, self.kv)
        rows = self.device.to_numpy(logits)
        if self.tracing is not None:
            attrs: dict[str, object] = {"batch_size": len(batch.seqs), "tokens": batch.n_tokens,
                                        "zinfer.actor": "drafter"}
            self.rounds.append(("draft_" + kind, t0, time.time_ns(), attrs))
        return rows

    def _trace(self, ask: DraftAsk) -> None:
        """The ask's rounds as spans under its first request, linked to the rest."""
        rounds, self.rounds = self.rounds, []
        if self.tracing is None:
            return
        parents = ask.traceparents
        for name, t0, t1, attrs in rounds:
            attrs["seq_ids"] = [s.seq_id for s in ask.seqs]
            self.tracing.record(name, parents[0] if parents else None, attrs, parents[1:], t0, t1)


class DraftClient(RequestClient[DrafterInbox, DraftReply]):
    """The scheduler's end: one ask in flight at a time."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str):
        super().__init__(ctx, address, DrafterInbox, DraftReply)
