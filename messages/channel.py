"""Typed endpoints: an AsyncSocket plus the Codec of what crosses it.

`Inbox` receives one tagged union (a malformed frame is logged and skipped: a bad
message never takes an actor down). `Outbox` sends. Both inherit the socket's
backpressure: send waits at the high-water mark.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
import structlog
import zmq

from zinfer.messages.bus import AsyncSocket
from zinfer.messages.codec import Codec

T = TypeVar("T")
log = structlog.get_logger("zinfer.bus")


class Inbox(Generic[T]):
    """The receiving end of an actor (PULL): one task receives."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, type_: Any, *, bind: bool = True):
        self.sock = AsyncSocket(ctx, zmq.PULL, bind=address if bind else None, connect=None if bind else address)
        self.codec: Codec[T] = Codec(type_)

    async def recv(self) -> T:
        while True:
            frames = await self.sock.recv()
            try:
                return self.codec.decode(frames)
            except msgspec.MsgspecError as exc:
                log.warning("dropped malformed message", endpoint=self.sock.endpoint, error=str(exc))

    def close(self) -> None:
        self.sock.close()


class Outbox(Generic[T]):
    """A sending end (PUSH) connected to another actor's inbox: one task sends."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, type_: Any):
        self.sock = AsyncSocket(ctx, zmq.PUSH, connect=address)
        self.codec: Codec[T] = Codec(type_)

    async def send(self, msg: T) -> None:
        await self.sock.send(self.codec.encode(msg))

    def close(self) -> None:
        self.sock.close()
