"""ZeroMQ clients of the engine's front door: a trio client and a blocking one.

The wire protocol is messages/client.py: a DEALER sends one msgpack map per request
(`{"type": "generate", "request_id": ..., "prompt": ..., "params": {...}}`) and receives
events as msgpack maps tagged by "type"; every request ends with exactly one terminal
event (finished, cancelled, rejected, failed; tokenized for tokenize/detokenize).

Both clients encode a request in the caller's code and check it as the engine will
decode it, so a request the engine could not take (an id too long, a token id or seed
outside 64 bits) fails for its caller alone: AsyncClient answers it with a Rejected
event (EngineError from tokenize/detokenize/stats), Client raises EngineError.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, AsyncGenerator, Iterator, Protocol, Sequence, TypeVar, cast

import msgspec
import trio
import zmq

from zinfer.messages.bus import AsyncSocket
from zinfer.messages.client import (
    TERMINAL_EVENTS,
    Cancel,
    ClientEvent,
    ClientRequest,
    Detokenize,
    EngineStats,
    Failed,
    GetStats,
    Generate,
    Message,
    Rejected,
    Tokenize,
    TokenizeResult,
    ToolFunction,
)
from zinfer.messages.codec import Codec
from zinfer.messages.curve import ClientKeys
from zinfer.messages.params import SamplingParams

MessageIn = Message | dict[str, Any]
"""A chat message: a Message, or a map of its fields (checked as the engine decodes it)."""
ToolIn = ToolFunction | dict[str, Any]
"""A function the chat template offers: a ToolFunction, or a map of its fields."""
Reply = TypeVar("Reply", TokenizeResult, EngineStats)


class EngineError(RuntimeError):
    """A request ended with rejected or failed where a result was expected."""


def wire_frames(codec: Codec[ClientRequest], request: ClientRequest) -> list[bytes | memoryview]:
    """The frames of request, checked first as the engine will decode it; EngineError names what is wrong."""
    try:
        msgspec.convert(msgspec.to_builtins(request), codec.type)  # the decoder's bounds, with the field's path
        return codec.encode(request)
    except (msgspec.MsgspecError, OverflowError, RecursionError, TypeError, ValueError, NotImplementedError) as exc:
        raise EngineError(f"invalid request: {exc}") from None


class EngineClient(Protocol):
    """What the gateways ask of an engine from trio code: one engine's AsyncClient, or the
    router in front of many replicas (gateway/router.py). The calls mean what AsyncClient's do."""

    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[MessageIn] | None = None,
        prompt_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        traceparent: str | None = None,
        tools: Sequence[ToolIn] | None = None,
    ) -> AsyncGenerator[ClientEvent, None]: ...

    def cancel(self, request_id: str) -> None: ...

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[MessageIn] | None = None,
        add_special: bool = True,
        tools: Sequence[ToolIn] | None = None,
    ) -> list[int]: ...

    async def detokenize(self, token_ids: list[int]) -> str: ...

    async def stats(self) -> EngineStats: ...


class AsyncClient:
    """Talks to one engine from trio code. Use `async with AsyncClient(ctx, address) as c`.

    One task receives and routes events to per-request channels; one task sends
    (requests from any number of tasks queue in a channel, already encoded, so the
    sender cannot fail on one of them). When the client closes, every request still
    open gets a Failed event, so no stream waits forever.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, curve: ClientKeys | None = None,
                 heartbeat_s: float = 0.0):
        """curve: the keys for an engine whose endpoint is a CURVE server (`ClientKeys.load`).
        heartbeat_s > 0: ZeroMQ heartbeats every heartbeat_s; a peer silent for three of them
        is disconnected (a socket monitor sees it: gateway/router.py)."""
        self.sock = AsyncSocket(ctx, zmq.DEALER)
        if curve is not None:
            curve.apply(self.sock.socket)
        if heartbeat_s > 0:
            ms = max(1, int(heartbeat_s * 1000))
            self.sock.socket.setsockopt(zmq.HEARTBEAT_IVL, ms)
            self.sock.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ms)
            self.sock.socket.setsockopt(zmq.HEARTBEAT_TTL, 3 * ms)
        self.sock.socket.connect(address)
        self.requests_codec: Codec[ClientRequest] = Codec(ClientRequest)
        self.events_codec: Codec[ClientEvent] = Codec(ClientEvent)
        # encoded requests, each a list of frames
        self.out_tx, self.out_rx = trio.open_memory_channel[list[bytes | memoryview]](float("inf"))
        self.streams: dict[str, trio.MemorySendChannel[ClientEvent]] = {}

    async def __aenter__(self) -> "AsyncClient":
        self._nursery_cm: AbstractAsyncContextManager[trio.Nursery] = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        nursery.start_soon(self._send_loop)
        nursery.start_soon(self._recv_loop)
        self._nursery = nursery
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._nursery.cancel_scope.cancel()
        try:
            return await self._nursery_cm.__aexit__(exc_type, exc, tb)
        finally:
            self._fail_open("the client closed")
            self.sock.close()

    async def _send_loop(self) -> None:
        async for frames in self.out_rx:
            await self.sock.send(frames)

    async def _recv_loop(self) -> None:
        try:
            while True:
                event = self.events_codec.decode(await self.sock.recv())
                tx = self.streams.get(event.request_id)
                if tx is None:
                    continue
                if isinstance(event, TERMINAL_EVENTS):
                    del self.streams[event.request_id]
                tx.send_nowait(event)
        finally:
            self._fail_open("the engine connection ended")

    def _fail_open(self, message: str) -> None:
        for rid, tx in list(self.streams.items()):
            tx.send_nowait(Failed(rid, message))
        self.streams.clear()

    def _open(
        self, request: ClientRequest
    ) -> tuple[trio.MemorySendChannel[ClientEvent], trio.MemoryReceiveChannel[ClientEvent]]:
        """Queue request for sending; its events arrive on the receive channel returned.

        A request the engine could not take, or whose id is already open on this
        client, gets its Rejected event here and is not sent (nor in self.streams).
        """
        tx, rx = trio.open_memory_channel[ClientEvent](float("inf"))
        try:
            if request.request_id in self.streams:
                raise EngineError(f"request_id {request.request_id!r} is already in use")
            frames = wire_frames(self.requests_codec, request)
        except EngineError as exc:
            tx.send_nowait(Rejected(request.request_id, "bad_request", str(exc)))
            return tx, rx
        self.streams[request.request_id] = tx
        self.out_tx.send_nowait(frames)
        return tx, rx

    async def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[MessageIn] | None = None,
        prompt_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        traceparent: str | None = None,
        tools: Sequence[ToolIn] | None = None,
    ) -> AsyncGenerator[ClientEvent, None]:
        """Stream one request's events, ending with its terminal event. `tools`, with
        messages: ToolFunctions (or their maps) the chat template offers the model.

        Leaving the loop early (break, cancellation, an exception) cancels the request.
        """
        req = Generate(
            request_id or uuid.uuid4().hex,
            prompt,
            _as_messages(messages),
            prompt_ids,
            params or SamplingParams(),
            add_special,
            traceparent,
            _as_tools(tools),
        )
        tx, rx = self._open(req)
        done = False
        try:
            async for event in rx:
                done = isinstance(event, TERMINAL_EVENTS)
                yield event
                if done:
                    return
        finally:
            if not done and self.streams.get(req.request_id) is tx:
                self.cancel(req.request_id)

    def cancel(self, request_id: str) -> None:
        """Ask the engine to cancel a request; its stream then ends with Cancelled. EngineError: not a valid id."""
        self.out_tx.send_nowait(wire_frames(self.requests_codec, Cancel(request_id)))

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[MessageIn] | None = None,
        add_special: bool = True,
        tools: Sequence[ToolIn] | None = None,
    ) -> list[int]:
        request = Tokenize(uuid.uuid4().hex, text, _as_messages(messages), add_special, _as_tools(tools))
        return (await self._one(request, TokenizeResult)).token_ids

    async def detokenize(self, token_ids: list[int]) -> str:
        return (await self._one(Detokenize(uuid.uuid4().hex, list(token_ids)), TokenizeResult)).text

    async def stats(self) -> EngineStats:
        """Queue depth, running sequences and KV usage as of the last round."""
        return await self._one(GetStats(uuid.uuid4().hex), EngineStats)

    async def _one(self, request: ClientRequest, reply: type[Reply]) -> Reply:
        """The request's one reply; EngineError when it is refused or fails."""
        async for event in self._open(request)[1]:
            if isinstance(event, (Rejected, Failed)):
                raise EngineError(event.message)
            if isinstance(event, reply):
                return event
        raise EngineError("no reply")


class Client:
    """A blocking client for plain scripts: plain zmq, one request at a time per call."""

    def __init__(
        self,
        address: str,
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        timeout_s: float = 300.0,
        curve: ClientKeys | None = None,
    ):
        """curve: the keys for an engine whose endpoint is a CURVE server (`ClientKeys.load`).
        A server that refuses the handshake leaves no connection: a send or a receive then
        raises EngineError after timeout_s."""
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
        self.sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))  # a DEALER with no connection blocks
        if curve is not None:
            curve.apply(self.sock)
        self.sock.connect(address)
        self.requests_codec: Codec[ClientRequest] = Codec(ClientRequest)
        self.events_codec: Codec[ClientEvent] = Codec(ClientEvent)

    def send(self, request: ClientRequest) -> None:
        """Send one request; EngineError (nothing sent) when the engine could not take it."""
        try:
            self.sock.send_multipart(wire_frames(self.requests_codec, request))
        except zmq.Again:
            why = "is it up, and does it accept this client's CURVE keys?"
            raise EngineError(f"no connection to the engine within the timeout ({why})") from None

    def events(self, request_id: str) -> Iterator[ClientEvent]:
        """Events of one request until its terminal (others' events are skipped)."""
        while True:
            try:
                event = self.events_codec.decode(self.sock.recv_multipart())
            except zmq.Again:
                raise EngineError(f"no event for {request_id} within the timeout") from None
            if event.request_id != request_id:
                continue
            yield event
            if isinstance(event, TERMINAL_EVENTS):
                return

    def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[MessageIn] | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Iterator[ClientEvent]:
        rid = request_id or uuid.uuid4().hex
        req = Generate(rid, prompt, _as_messages(messages), params=params or SamplingParams())
        self.send(req)
        done = False
        try:
            for event in self.events(req.request_id):
                done = isinstance(event, TERMINAL_EVENTS)
                yield event
        finally:
            if not done:
                self.send(Cancel(req.request_id))

    def cancel(self, request_id: str) -> None:
        self.send(Cancel(request_id))

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        req = Tokenize(uuid.uuid4().hex, text, add_special=add_special)
        self.send(req)
        for event in self.events(req.request_id):
            if isinstance(event, TokenizeResult):
                return event.token_ids
            if isinstance(event, (Rejected, Failed)):
                raise EngineError(event.message)
        raise EngineError("no reply")

    def close(self) -> None:
        self.sock.close(linger=0)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_messages(messages: Sequence[MessageIn] | None) -> list[Message] | None:
    """messages as Generate's field holds them: maps stay maps, which encode as Messages do
    (wire_frames checks them as the engine decodes them)."""
    return None if messages is None else cast(list[Message], list(messages))


def _as_tools(tools: Sequence[ToolIn] | None) -> list[ToolFunction] | None:
    """tools as Generate's field holds them (maps stay maps, as in _as_messages)."""
    return None if tools is None else cast(list[ToolFunction], list(tools))
