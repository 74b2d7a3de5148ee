"""The websocket endpoint /v1/ws for chat UIs, and the chat page at / that uses it.

One socket carries any number of generations at once. The client names each with
its own "id"; the engine sees it as "ws<N>.<id>" (N numbers the sockets), so ids only
need to be unique within one socket among the generations still running. Messages
are JSON objects with a "type" (the protocol is written down in gateway/PROTOCOL.md):

  client: generate {id, prompt | messages, params?, add_special?}, cancel {id}, ping
  server: started, delta {id, index, text}, done {id, finish_reason, usage},
          cancelled {id}, error {id | null, code, message}, pong

Every generate ends with exactly one of done, cancelled or error (an error naming an
id is that generation's terminal; an id still running cannot be reused, and that
error has id null). A message that is not understood gets an error and the socket
stays open. Closing the socket cancels
its generations. Events queue without bound for the one sender task per socket.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Callable, Coroutine

import msgspec
import structlog
import trio
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.datastructures import Headers, QueryParams
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from zinfer.gateway.auth import authorized
from zinfer.gateway.state import GatewayState
from zinfer.gateway.client import EngineClient, EngineError
from zinfer.messages.json_errors import validation_message
from zinfer.messages.client import MAX_REQUEST_ID, Cancelled, Delta, Failed, Finished, Rejected, Started
from zinfer.messages.params import SamplingParams

log = structlog.get_logger("zinfer.websocket")

STATIC = Path(__file__).parent / "static"
ASSETS = {"chat.html": "text/html", "chat.js": "text/javascript", "chat.css": "text/css"}
SOCKET_NUMBERS = itertools.count(1)
MAX_WS_ID = MAX_REQUEST_ID - 56
"""Characters in a client's id: with the engine's prefix "ws<N>." it stays within the engine's request id bound."""
WsId = Annotated[str, msgspec.Meta(max_length=MAX_WS_ID)]
ServerMessage = dict[str, Any]
"""A message to the client: a JSON object with a "type" (gateway/PROTOCOL.md)."""


class WsGenerate(msgspec.Struct, tag="generate", tag_field="type", forbid_unknown_fields=True):
    id: WsId
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    add_special: bool = True


class WsCancel(msgspec.Struct, tag="cancel", tag_field="type", forbid_unknown_fields=True):
    id: WsId


class WsPing(msgspec.Struct, tag="ping", tag_field="type", forbid_unknown_fields=True):
    pass


WsRequest = WsGenerate | WsCancel | WsPing


class _Head(msgspec.Struct):
    """The type and id of a message, read without converting any other value."""

    type: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty when absent
    id: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


def _head(text: str) -> tuple[object, str | None]:
    """The message's type and its string id (None when it has none or they cannot be read)."""
    try:
        head = msgspec.json.decode(text, type=_Head)
        kind = msgspec.json.decode(head.type) if len(head.type) else None
        mid = msgspec.json.decode(head.id) if len(head.id) else None
    except msgspec.DecodeError:
        return None, None
    return kind, mid if isinstance(mid, str) else None


class BadMessage(Exception):
    """A client message that cannot be acted on: becomes an error message, not a close."""

    def __init__(self, code: str, message: str, id: str | None = None):
        super().__init__(message)
        self.code, self.message, self.id = code, message, id


def error(id: str | None, code: str, message: str) -> ServerMessage:
    return {"type": "error", "id": id, "code": code, "message": message}


class ChatSocket:
    """One accepted websocket: reads client messages, runs one task per generation.

    `running` maps the client's ids to engine request ids for generations not yet
    ended; `unsent` holds those whose task has not sent the request to the engine yet
    (a cancel then stops it there, since the engine has nothing to cancel). The nursery
    that owns their tasks is cancelled when the socket closes, and AsyncClient.generate
    then cancels each one in the engine.
    """

    def __init__(self, ws: WebSocket, state: GatewayState):
        self.ws = ws
        self.state = state
        self.prefix = f"ws{next(SOCKET_NUMBERS)}."
        self.decoder = msgspec.json.Decoder(WsRequest)
        self.encoder = msgspec.json.Encoder()
        self.out_tx, self.out_rx = trio.open_memory_channel[ServerMessage](float("inf"))
        self.running: dict[str, str] = {}
        self.unsent: set[str] = set()

    def send(self, message: ServerMessage) -> None:
        """Queue one message for the sender task."""
        self.out_tx.send_nowait(message)

    async def run(self) -> None:
        """Serve the socket until the client closes it."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_loop, nursery.cancel_scope)
            try:
                while True:
                    message = await self.ws.receive()  # (receive_text raised KeyError on a binary frame: 1011)
                    if message["type"] == "websocket.disconnect":
                        raise WebSocketDisconnect(message.get("code", 1000))
                    text = message.get("text")
                    if text is None:
                        binary = "binary frames are not supported: send each message as JSON text"
                        self.send(error(None, "bad_message", binary))
                        continue
                    try:
                        self.handle(nursery, self.parse(text))
                    except BadMessage as exc:
                        self.send(error(exc.id, exc.code, exc.message))
                    except RecursionError:  # msgspec recurses per nesting level; no id can be read
                        self.send(error(None, "bad_json", "the message is nested too deeply"))
            except WebSocketDisconnect:
                pass
            finally:
                nursery.cancel_scope.cancel()

    async def _send_loop(self, scope: trio.CancelScope) -> None:
        async for message in self.out_rx:
            try:
                await self.ws.send_text(self.encoder.encode(message).decode())
            except Exception as exc:  # the peer is gone: whatever the server raises, stop serving it
                log.debug("websocket send failed", error=repr(exc))
                scope.cancel()
                return

    def parse(self, text: str) -> WsRequest:
        """Decode one client message or raise BadMessage saying what is wrong."""
        try:
            msg = self.decoder.decode(text)
        except msgspec.ValidationError as exc:  # (a DecodeError subclass: test it first)
            try:
                msgspec.json.decode(text)  # "[x": the typed decoder stopped at "[", this one reads on
            except msgspec.ValidationError:  # JSON, but a number past Python's range: the typed error names it
                pass
            except msgspec.DecodeError as bad:  # (RecursionError: run() answers it)
                raise BadMessage("bad_json", f"not a JSON message: {bad}") from None
            kind, mid = _head(text)
            if kind not in ("generate", "cancel", "ping"):
                unknown = f"unknown message type {kind!r} (generate, cancel, ping)"
                raise BadMessage("bad_message", unknown, mid) from None
            # only a generate's id: an error naming a running generation's id would be read as its terminal
            generate_id = mid if kind == "generate" else None
            raise BadMessage("bad_message", validation_message(exc, text), generate_id) from None
        except msgspec.DecodeError as exc:
            raise BadMessage("bad_json", f"not a JSON message: {exc}") from None
        if isinstance(msg, WsGenerate):
            if (msg.prompt is None) == (msg.messages is None):
                raise BadMessage("bad_message", "give exactly one of prompt and messages", msg.id)
            try:
                msg.params.validate()  # a constraint is compiled at the engine's front door, before it is queued
            except ValueError as exc:
                raise BadMessage("bad_request", str(exc), msg.id) from None
        return msg

    def handle(self, nursery: trio.Nursery, msg: WsRequest) -> None:
        if isinstance(msg, WsPing):
            self.send({"type": "pong"})
        elif isinstance(msg, WsCancel):
            rid = self.running.get(msg.id)
            if msg.id in self.unsent:
                self.unsent.discard(msg.id)  # its task answers "cancelled" without sending it
            elif rid is not None and self.state.client is not None:
                try:
                    self.state.client.cancel(rid)  # the generation then ends with "cancelled"
                except EngineError as exc:  # (WsId keeps rid within the engine's bounds: not expected)
                    raise BadMessage("bad_message", f"cannot cancel {msg.id!r}: {exc}") from None
        else:
            if msg.id in self.running:
                # id null: not that generation's terminal
                raise BadMessage("id_in_use", f"a generation with id {msg.id!r} is still running")
            if self.state.client is None:
                raise BadMessage("loading", "the model is still loading", msg.id)
            self.running[msg.id] = self.prefix + msg.id
            self.unsent.add(msg.id)
            nursery.start_soon(self.generate, self.state.client, msg)

    async def generate(self, client: EngineClient, msg: WsGenerate) -> None:
        """Stream one generation's events to the socket, ending with its one terminal."""
        try:
            if msg.id not in self.unsent:  # cancelled before it was sent
                self.send({"type": "cancelled", "id": msg.id})
                return
            self.unsent.discard(msg.id)  # the first step of the loop below sends it, with no checkpoint before
            events = client.generate(
                msg.prompt,
                messages=msg.messages,
                params=msg.params,
                request_id=self.running[msg.id],
                add_special=msg.add_special,
            )
            async for ev in events:
                if isinstance(ev, Delta):
                    if ev.text:
                        self.send({"type": "delta", "id": msg.id, "index": ev.index, "text": ev.text})
                elif isinstance(ev, Started):
                    self.send({"type": "started", "id": msg.id, "prompt_tokens": ev.prompt_tokens})
                elif isinstance(ev, Finished):
                    usage = msgspec.structs.asdict(ev.usage)
                    self.send({"type": "done", "id": msg.id, "finish_reason": ev.finish_reasons[0],
                               "finish_reasons": ev.finish_reasons, "usage": usage})
                elif isinstance(ev, Cancelled):
                    self.send({"type": "cancelled", "id": msg.id})
                elif isinstance(ev, Rejected):
                    self.send(error(msg.id, ev.code, ev.message))
                elif isinstance(ev, Failed):
                    code = "bad_constraint" if ev.code == "bad_constraint" else "failed"
                    self.send(error(msg.id, code, ev.message))
        finally:
            self.running.pop(msg.id, None)
            self.unsent.discard(msg.id)


def _authorized(state: GatewayState, headers: Headers, query: QueryParams) -> bool:
    """With an API key set: 'Authorization: Bearer KEY', or ?api_key=KEY (browsers set no websocket headers).

    ApiKeyMiddleware checks this first; kept here so these routes stay guarded on their own."""
    return authorized(state.api_key, headers.get("authorization"), query.get("api_key"))


def routes(state: GatewayState) -> list[BaseRoute]:
    """The websocket route /v1/ws, the chat page / and its script and style under /static/."""

    async def chat_socket(ws: WebSocket) -> None:
        if not _authorized(state, ws.headers, ws.query_params):
            await ws.close(code=1008)
            return
        await ws.accept()
        await ChatSocket(ws, state).run()

    def asset(name: str, gated: bool = False) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        async def endpoint(request: Request) -> Response:
            if gated and not _authorized(state, request.headers, request.query_params):
                return PlainTextResponse("missing or wrong API key: add ?api_key=KEY", status_code=401)
            # a few KiB read per request (Starlette's FileResponse needs anyio threads, which
            # this trio version lacks); editing the page needs no restart
            return Response((STATIC / name).read_bytes(), media_type=f"{ASSETS[name]}; charset=utf-8",
                            headers={"Cache-Control": "no-cache"})

        return endpoint

    return [
        WebSocketRoute("/v1/ws", chat_socket),
        Route("/", asset("chat.html", gated=True)),
        Route("/static/chat.js", asset("chat.js")),
        Route("/static/chat.css", asset("chat.css")),
    ]
