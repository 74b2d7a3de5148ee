"""The asking end of an actor that answers one request at a time over a ROUTER (the KV actor,
the drafter): a DEALER socket, one call in flight, a Shutdown to end the actor."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import zmq

from zinfer.messages.bus import AsyncSocket
from zinfer.messages.codec import Codec
from zinfer.messages.engine import Shutdown

Inbox = TypeVar("Inbox")
Reply = TypeVar("Reply")


class RequestClient(Generic[Inbox, Reply]):
    """Sends the actor's inbox messages (`inbox`: their type or union) and decodes its `reply`s."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, inbox: Any, reply: type[Reply]):
        self.sock = AsyncSocket(ctx, zmq.DEALER, connect=address)
        self.out: Codec[Inbox] = Codec(inbox)
        self.inp: Codec[Reply] = Codec(reply)

    async def call(self, ask: Inbox) -> Reply:
        await self.sock.send(self.out.encode(ask))
        return self.inp.decode(await self.sock.recv())

    async def shutdown(self) -> None:
        await self.sock.send(self.out.encode(Shutdown()))  # type: ignore[arg-type]  # every inbox holds Shutdown

    def close(self) -> None:
        self.sock.close()
