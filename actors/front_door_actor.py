"""The front door actor: the engine's only voice to clients. It tokenizes, checks, admits.

Clients (DEALER) talk to its ROUTER. For each request it renders the chat template and
encodes the prompt (tokenizes), refuses what can never run (checks: the context length,
the choice count, the grammar through actors/grammar_checker.py), and admits one sequence
per choice to the scheduler. Tokens coming back from the scheduler are detokenized
incrementally (never half a UTF-8 character) and matched against stop strings before they
reach the client as deltas. On the wire its role is `front_door` (its address in
actors/topology.py, FrontDoorInbox in messages/engine.py).

Because every client event leaves from here, this actor guarantees the contract:
each request gets exactly one terminal event (its state is dropped as it is sent).
A generation is registered before its prompt is encoded (a Cancel or a failure in
the meantime ends it; the encoding's result is then dropped), and encoding runs
off the event loop when it is large (actors/prompt_encoding.py). Once an actor has
failed or the engine shut down, every new generation is answered with Failed.

Backpressure: client events queue in an unbounded channel to the ROUTER sender task
(a slow client never stalls the engine); ROUTER sends to a full peer wait.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import msgspec
import structlog
import trio
import zmq
from opentelemetry.trace import Span

from zinfer.actors.front_door_requests import Choice, Request, check_before_encoding, request_fields
from zinfer.actors.front_door_tokenize import detokenize_reply, tokenize_reply
from zinfer.actors.grammar_checker import GrammarChecker
from zinfer.actors.prompt_encoding import (
    EncodingWorker,
    PromptLimits,
    PromptTooLong,
    encode_prompt,
    input_size,
)
from zinfer.actors.topology import Addresses
from zinfer.messages.bus import AsyncSocket, PeerGone
from zinfer.messages.channel import Inbox, Outbox
from zinfer.messages.client import (
    Cancel,
    Cancelled,
    ClientEvent,
    ClientRequest,
    Detokenize,
    EngineStats,
    Failed,
    GetStats,
    Finished,
    Generate,
    Rejected,
    Started,
    Tokenize,
    request_id_of,
)
from zinfer.messages.codec import Codec
from zinfer.messages.curve import KeyPair, bind_public
from zinfer.messages.engine import (
    CONSTRAINT_FAILURE,
    Abort,
    ActorFailed,
    Admit,
    SchedulerInbox,
    SchedulerStats,
    SeqOutput,
    SeqOutputs,
    SeqRejected,
    Shutdown,
    FrontDoorInbox,
)
from zinfer.models.detokenize import IncrementalDetokenizer, StopMatcher
from zinfer.models.prompt import PromptBuilder
from zinfer.traces.config import REQUEST, TOKENIZE
from zinfer.messages.params import SamplingParams
from zinfer.traces.setup import Tracing

log = structlog.get_logger("zinfer.front_door")

MAX_PUBLIC_MESSAGE = 16 * 1024 * 1024
"""The largest message (bytes) a client of a public endpoint (`--zmq`) may send: libzmq
drops the connection of a peer that sends more, before the message is buffered whole.
The in-process front door (inproc, the gateways' own) has no such cap."""

SEED_RANGE = 2**64
"""Seeds are taken modulo this: choice i of a seeded request samples with seed + i."""


class GrammarRefused(ValueError):
    """The request's constraint did not pass the grammar check."""


@dataclass
class FrontDoorActor:
    ctx: zmq.Context[zmq.Socket[bytes]]
    addrs: Addresses
    prompts: PromptBuilder
    max_model_len: int
    requests: dict[tuple[bytes, str], Request] = field(default_factory=dict)
    by_seq: dict[int, Request] = field(default_factory=dict)
    public: list[str] = field(default_factory=list)  # extra endpoints the front door binds (tcp://...)
    public_curve: KeyPair | None = None  # CURVE server keys of the public endpoints (None: plain)
    stats: SchedulerStats = field(default_factory=SchedulerStats)
    tracing: Tracing | None = None  # None: tracing off
    grammar_model: str | None = None  # the model constraints are checked against (None: the sampler alone checks them)
    # sequences the scheduler queues at once: a request of more (n) could never be admitted; 0: unchecked
    max_waiting: int = 0

    def __post_init__(self) -> None:
        self.front = AsyncSocket(self.ctx, zmq.ROUTER, bind=self.addrs.frontend)
        # bound endpoints keep the options of their bind
        self.front.socket.setsockopt(zmq.MAXMSGSIZE, MAX_PUBLIC_MESSAGE)
        bind_public(self.front.socket, self.public, self.public_curve)
        self.inbox: Inbox[FrontDoorInbox] = Inbox(self.ctx, self.addrs.front_door, FrontDoorInbox)
        self.to_scheduler: Outbox[SchedulerInbox] = Outbox(self.ctx, self.addrs.scheduler, SchedulerInbox)
        self.requests_codec: Codec[ClientRequest] = Codec(ClientRequest)
        self.events_codec: Codec[ClientEvent] = Codec(ClientEvent)
        self.seq_ids = itertools.count(1)
        self.client_tx, self.client_rx = trio.open_memory_channel[tuple[bytes, ClientEvent]](float("inf"))
        self.sched_tx, self.sched_rx = trio.open_memory_channel[SchedulerInbox](float("inf"))
        self.limits = PromptLimits.for_tokenizer(self.prompts.tokenizer, self.max_model_len)
        self.worker = EncodingWorker()
        self.down: str | None = None  # why new generations fail at once (an actor died, shutdown)
        self.grammars = GrammarChecker(self.grammar_model) if self.grammar_model is not None else None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.tasks = nursery  # one task per request being encoded
                nursery.start_soon(self._send_clients)
                nursery.start_soon(self._send_scheduler)
                nursery.start_soon(self._from_clients)
                task_status.started()
                await self._from_scheduler()
                nursery.cancel_scope.cancel()
        finally:
            for end in (self.front, self.inbox, self.to_scheduler):
                end.close()
            if self.grammars is not None:
                await self.grammars.aclose()

    # ---- sockets: one task each -----------------------------------------------------

    async def _send_clients(self) -> None:
        async for peer, event in self.client_rx:
            try:
                await self.front.send([peer, *self.events_codec.encode(event)])
            except PeerGone:
                self._drop_peer(peer)

    async def _send_scheduler(self) -> None:
        async for msg in self.sched_rx:
            await self.to_scheduler.send(msg)

    async def _from_clients(self) -> None:
        while True:
            routing_id, *frames = await self.front.recv()
            peer = bytes(routing_id)  # a ROUTER's routing id: a few bytes, so already bytes (no copy)
            try:
                req = self.requests_codec.decode(frames)
            except msgspec.MsgspecError as exc:
                request_id = request_id_of(frames[0], "msgpack") if frames else ""
                self._emit(peer, Rejected(request_id, "bad_request", f"malformed request: {exc}"))
                continue
            self.handle_request(peer, req)

    async def _from_scheduler(self) -> None:
        while True:
            msg = await self.inbox.recv()
            if isinstance(msg, Shutdown):
                self.fail_all("the engine shut down")
            elif isinstance(msg, SeqOutputs):
                self.stats = msg.stats
                for out in msg.outputs:
                    self.handle_output(out)
            elif isinstance(msg, SeqRejected):
                self.handle_rejected(msg)
            elif isinstance(msg, ActorFailed):
                self.fail_all(f"{msg.actor} failed: {msg.message}")

    # ---- requests -------------------------------------------------------------------

    def handle_request(self, peer: bytes, req: ClientRequest) -> None:
        if isinstance(req, Generate):
            self._generate(peer, req)
        elif isinstance(req, Cancel):
            r = self.requests.get((peer, req.request_id))
            if r is not None:
                self._finish(r, Cancelled(r.request_id, r.usage()), abort="cancelled")
        elif isinstance(req, Tokenize):
            self.tasks.start_soon(self._tokenize, peer, req)
        elif isinstance(req, GetStats):
            s = self.stats
            self._emit(peer, EngineStats(
                req.request_id,
                s.running,
                s.waiting,
                s.kv_blocks,
                s.kv_used_blocks,
                s.kv_cached_blocks,
                s.rounds,
                len(self.requests),
                s.drafted_tokens,
                s.accepted_tokens,
            ))
        elif isinstance(req, Detokenize):
            self.tasks.start_soon(self._detokenize, peer, req)

    async def _tokenize(self, peer: bytes, req: Tokenize) -> None:
        self._emit(peer, await tokenize_reply(self.worker, self.prompts, self.limits, self.max_model_len, req))

    async def _detokenize(self, peer: bytes, req: Detokenize) -> None:
        self._emit(peer, await detokenize_reply(self.worker, self.prompts, req))

    def _generate(self, peer: bytes, req: Generate) -> None:
        """Check what is cheap to check, register the request, and start encoding its prompt."""
        rid = req.request_id
        if self.down is not None:
            self._emit(peer, Failed(rid, self.down))
            return
        if (peer, rid) in self.requests:
            self._emit(peer, Rejected(rid, "bad_request", f"request_id {rid!r} is already in use"))
            return
        started = time.perf_counter()
        span = tok_span = None
        if self.tracing is not None:
            span = self.tracing.start(REQUEST, req.traceparent, {"request_id": rid, "zinfer.actor": "front_door"})
            tok_span = self.tracing.start(TOKENIZE, span, {"zinfer.actor": "front_door"})
        r = Request(rid, peer, [], [], params=req.params, started=started, span=span)
        try:
            check_before_encoding(req, self.prompts, self.limits, self.max_model_len, self.max_waiting)
        except ValueError as exc:
            self._close(r, self._refusal(r, exc), tok_span)
            return
        self.requests[(peer, rid)] = r
        self.tasks.start_soon(self._encode_and_admit, r, req, tok_span)

    async def _encode_and_admit(self, r: Request, req: Generate, tok_span: Span | None) -> None:
        """Encode r's prompt (off the loop when large), then admit a sequence per choice.

        If r ended meanwhile (cancelled, failed, its client gone), its terminal event is
        already out: the result is dropped."""
        refusal: Rejected | Failed | None = None
        params = req.params
        try:
            r.prompt_ids = await self.worker.run(input_size(req), encode_prompt, self.prompts, self.limits, req)
            params = await self._checked_grammar(params)
        except ValueError as exc:
            refusal = self._refusal(r, exc)
        except Exception as exc:  # a tokenizer bug fails this request only
            log.exception("encoding failed", request_id=r.request_id)
            refusal = Failed(r.request_id, f"cannot encode the prompt: {exc!r}")
        if tok_span is not None:
            tok_span.set_attribute("prompt_tokens", len(r.prompt_ids))
            tok_span.end()
        if self.requests.get((r.peer, r.request_id)) is not r:
            return
        if refusal is not None:
            self._finish(r, refusal)
            return
        self._admit(r, params, req.traceparent)

    async def _checked_grammar(self, params: SamplingParams) -> SamplingParams:
        """params with its constraint as the grammar worker compiled it (GBNF as Lark);
        GrammarRefused when the worker refuses it. A grammar the engine runs is one the
        worker compiled (actors/grammar_checker.py)."""
        if params.constraint is None or self.grammars is None:
            return params
        try:
            return msgspec.structs.replace(params, constraint=await self.grammars.check(params.constraint))
        except ValueError as exc:
            raise GrammarRefused(str(exc)) from None

    def _refusal(self, r: Request, exc: ValueError) -> Rejected:
        if isinstance(exc, GrammarRefused):
            return Rejected(r.request_id, "bad_constraint", CONSTRAINT_FAILURE + str(exc))
        if isinstance(exc, PromptTooLong):
            return Rejected(r.request_id, "too_long", str(exc), n_prompt_tokens=exc.n_tokens, n_ctx=self.max_model_len)
        return Rejected(r.request_id, "bad_request", str(exc))

    def _admit(self, r: Request, p: SamplingParams, client_traceparent: str | None) -> None:
        """Send Started and one Admit per choice (seeded choice i samples with seed + i)."""
        ids = r.prompt_ids
        r.logprobs, r.top_n = p.logprobs is not None, p.logprobs or 0
        traceparent = Tracing.traceparent(r.span) if r.span is not None else client_traceparent
        self._emit(r.peer, Started(r.request_id, len(ids)))
        eos = sorted(self.prompts.tokenizer.eos_ids)
        for i in range(p.n):
            seq_id = next(self.seq_ids)
            r.choices.append(Choice(seq_id, IncrementalDetokenizer(self.prompts.tokenizer), StopMatcher(p.stop)))
            self.by_seq[seq_id] = r
            params = p if p.seed is None or i == 0 else msgspec.structs.replace(p, seed=(p.seed + i) % SEED_RANGE)
            self.sched_tx.send_nowait(Admit(seq_id, ids, params, eos, traceparent))

    # ---- outputs --------------------------------------------------------------------

    def handle_output(self, out: SeqOutput) -> None:
        r = self.by_seq.get(out.seq_id)
        if r is None:
            return  # its request already ended (cancelled, stop string)
        if out.error is not None:
            # sampling this sequence (or computing its round) failed: the request fails, its other choices are aborted
            self.by_seq.pop(out.seq_id, None)
            self._finish(r, Failed(r.request_id, out.error.message.strip(), out.error.code), abort="failed")
            return
        index, choice = next((i, c) for i, c in enumerate(r.choices) if c.seq_id == out.seq_id)
        r.cached_tokens = max(r.cached_tokens, out.cached_tokens)
        if not r.first_token:
            r.first_token = time.perf_counter()
        text, reason, kept = choice.feed(out.token_ids, out.finish_reason)
        if kept < len(out.token_ids):  # a stop string ended it before this output's last token
            out = msgspec.structs.replace(out, token_ids=out.token_ids[:kept], top=out.top and out.top[:kept],
                                          logprobs=out.logprobs and out.logprobs[:kept])
        r.drafted_tokens += out.drafted
        r.accepted_tokens += min(out.accepted, kept)
        if reason and not out.finish_reason:  # a stop string ended it: the scheduler still runs it
            self.by_seq.pop(out.seq_id, None)
            self.sched_tx.send_nowait(Abort(out.seq_id, "stop string"))
        self._emit(r.peer, r.delta(index, out, text, reason))
        if reason:
            choice.finish_reason = reason
            self.by_seq.pop(out.seq_id, None)
            reasons = [c.finish_reason for c in r.choices if c.finish_reason]
            if len(reasons) == len(r.choices):  # every choice finished
                self._finish(r, Finished(r.request_id, reasons, r.usage(), r.prompt_ids))

    def handle_rejected(self, msg: SeqRejected) -> None:
        r = self.by_seq.get(msg.seq_id)
        if r is not None:
            rejected = Rejected(r.request_id, msg.code, msg.message, n_prompt_tokens=len(r.prompt_ids))
            self._finish(r, rejected, abort="rejected")

    def fail_all(self, message: str) -> None:
        """Fail every open request and every later generation (an actor died or the engine stops)."""
        self.down = message
        for r in list(self.requests.values()):
            self._finish(r, Failed(r.request_id, message))

    # ---- helpers --------------------------------------------------------------------

    def _finish(self, r: Request, terminal: ClientEvent, abort: str | None = None) -> None:
        """Send r's one terminal event and forget it; abort its live sequences if asked."""
        self.requests.pop((r.peer, r.request_id), None)
        for c in r.choices:
            if self.by_seq.pop(c.seq_id, None) is not None and abort:
                self.sched_tx.send_nowait(Abort(c.seq_id, abort))
        self._close(r, terminal)

    def _close(self, r: Request, terminal: ClientEvent | None, *open_spans: Span | None) -> None:
        """Send r's terminal event (None: its client is gone), log its line, end its spans."""
        if terminal is not None:
            self._emit(r.peer, terminal)
        outcome = type(terminal).__name__.lower() if terminal is not None else "client_gone"
        reasons = [c.finish_reason for c in r.choices if c.finish_reason]
        fields = request_fields(r, outcome, reasons, time.perf_counter())
        log.info("request", **fields)
        for span in (*open_spans, r.span):
            if span is not None:
                if span is r.span:
                    span.set_attributes({k: v for k, v in fields.items() if v is not None and k != "request_id"})
                span.end()

    def _drop_peer(self, peer: bytes) -> None:
        for r in [r for (p, _), r in self.requests.items() if p == peer]:
            self.requests.pop((peer, r.request_id), None)
            for c in r.choices:
                if self.by_seq.pop(c.seq_id, None) is not None:
                    self.sched_tx.send_nowait(Abort(c.seq_id, "client gone"))
            self._close(r, None)

    def _emit(self, peer: bytes, event: ClientEvent) -> None:
        self.client_tx.send_nowait((peer, event))
