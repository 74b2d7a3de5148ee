"""The router's front door: the engine's ZeroMQ client protocol (messages/client.py) served by
the router, so ZeroMQ clients (`--zmq`) and `zinfer stdio` reach the replicas as they reach
one engine.

A ROUTER socket bound at an inproc address (the stdio relay's) and at the public endpoints
(CURVE servers under the given keys, with the context's client allowlist) decodes each
request, as the engine's front door does: a malformed one gets Rejected "bad_request"; a
Generate streams the router's events back to its peer; Cancel, Tokenize, Detokenize and
GetStats are answered from the router. Request ids are the peer's own: the same id from two
peers names two requests (each is sent to the replicas under an id of its own).
"""

from __future__ import annotations

import uuid
from contextlib import aclosing

import msgspec
import trio
import zmq

from zinfer.gateway.client import EngineError
from zinfer.gateway.router import Router
from zinfer.messages.bus import AsyncSocket, PeerGone
from zinfer.messages.client import (
    Cancel,
    ClientEvent,
    ClientRequest,
    Detokenize,
    Failed,
    Generate,
    GetStats,
    Rejected,
    Tokenize,
    TokenizeResult,
    request_id_of,
)
from zinfer.messages.codec import Codec
from zinfer.messages.curve import KeyPair, bind_public

MAX_PUBLIC_MESSAGE = 16 * 1024 * 1024
"""The largest message (bytes) a public client may send, as the engine's front door allows."""


class RouterFrontDoor:
    """Serves the client protocol from a Router until cancelled. `address`: its inproc endpoint."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], router: Router, public: tuple[str, ...] = (),
                 public_curve: KeyPair | None = None):
        self.router = router
        self.address = f"inproc://zinfer-router-front-{uuid.uuid4().hex[:12]}"
        self.sock = AsyncSocket(ctx, zmq.ROUTER, bind=self.address)
        if public:
            self.sock.socket.setsockopt(zmq.MAXMSGSIZE, MAX_PUBLIC_MESSAGE)
            bind_public(self.sock.socket, public, public_curve)
        self.requests: Codec[ClientRequest] = Codec(ClientRequest)
        self.events: Codec[ClientEvent] = Codec(ClientEvent)
        self.out_tx, self.out_rx = trio.open_memory_channel[tuple[bytes, ClientEvent]](float("inf"))
        self.open: dict[tuple[bytes, str], str] = {}  # (peer, its request id) -> the id sent to replicas

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._send)
                task_status.started()
                await self._receive()
        finally:
            self.sock.close()

    def _emit(self, peer: bytes, event: ClientEvent) -> None:
        self.out_tx.send_nowait((peer, event))

    async def _send(self) -> None:
        async for peer, event in self.out_rx:
            try:
                await self.sock.send([peer, *self.events.encode(event)])
            except PeerGone:
                for key in [k for k in self.open if k[0] == peer]:  # a client that left cancels its requests
                    self.router.cancel(self.open[key])

    async def _receive(self) -> None:
        while True:
            routing_id, *frames = await self.sock.recv()
            peer = bytes(routing_id)
            try:
                req = self.requests.decode(frames)
            except msgspec.MsgspecError as exc:
                rid = request_id_of(frames[0], "msgpack") if frames else ""
                self._emit(peer, Rejected(rid, "bad_request", f"malformed request: {exc}"))
                continue
            self.handle(peer, req)

    def handle(self, peer: bytes, req: ClientRequest) -> None:
        if isinstance(req, Generate):
            if (peer, req.request_id) in self.open:
                self._emit(peer, Rejected(req.request_id, "bad_request",
                                          f"request_id {req.request_id!r} is already in use"))
                return
            inner = uuid.uuid4().hex
            self.open[(peer, req.request_id)] = inner
            self._nursery.start_soon(self._generate, peer, req, inner)
        elif isinstance(req, Cancel):
            inner_id = self.open.get((peer, req.request_id))
            if inner_id is not None:
                self.router.cancel(inner_id)
        else:
            self._nursery.start_soon(self._answer, peer, req)

    async def _generate(self, peer: bytes, req: Generate, inner: str) -> None:
        try:
            async with aclosing(self.router.generate(
                    req.prompt, messages=req.messages, prompt_ids=req.prompt_ids, params=req.params,
                    request_id=inner, add_special=req.add_special, traceparent=req.traceparent,
                    tools=req.tools)) as events:
                async for event in events:
                    self._emit(peer, msgspec.structs.replace(event, request_id=req.request_id))
        finally:
            del self.open[(peer, req.request_id)]

    async def _answer(self, peer: bytes, req: ClientRequest) -> None:
        rid = req.request_id
        try:
            if isinstance(req, Tokenize):
                ids = await self.router.tokenize(req.text, messages=req.messages, add_special=req.add_special,
                                                 tools=req.tools)
                self._emit(peer, TokenizeResult(rid, ids))
            elif isinstance(req, Detokenize):
                self._emit(peer, TokenizeResult(rid, [], await self.router.detokenize(req.token_ids)))
            elif isinstance(req, GetStats):
                self._emit(peer, msgspec.structs.replace(await self.router.stats(), request_id=rid))
        except EngineError as exc:
            self._emit(peer, Failed(rid, str(exc)))
