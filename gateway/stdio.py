"""`zinfer stdio`: the engine embedded in a host program over stdin/stdout JSON lines.

The host writes one request per line on our stdin and reads one event per line from
our stdout. Requests and events are the maps of messages/client.py encoded as JSON
instead of msgpack ({"type": "generate", "request_id": "a", "prompt": "Hi", ...}), so
this module is a relay: each line is validated, re-encoded and sent to the engine's
front door over a DEALER, and each event coming back is written as one JSON line.
The protocol is written down in gateway/PROTOCOL.md.

Lifecycle: logs go to stderr only (the real stdout is kept for the protocol and fd 1
is pointed at stderr, so a stray print cannot corrupt the stream); {"type": "ready"}
is written once the engine is up; a line that is not a valid request gets a
`rejected` event with code "bad_request" and the process carries on; at EOF on stdin
the requests still open run to their terminal event, then the process exits 0. A host
that closes our stdout gets its open requests cancelled and the process exits 0 with
one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import msgspec
import structlog
import trio
import zmq

from zinfer.actors.engine import open_engine
from zinfer.gateway.cli_config import engine_config
from zinfer.messages.bus import AsyncSocket
from zinfer.messages.client import TERMINAL_EVENTS, Cancel, ClientEvent, ClientRequest, Rejected, request_id_of
from zinfer.messages.codec import Codec
from zinfer.messages.json_errors import validation_message

log = structlog.get_logger("zinfer.stdio")

MAX_LINE = 16 * 1024 * 1024
"""A request line longer than this (bytes) is rejected and skipped."""


class Ready(msgspec.Struct, tag="ready", tag_field="type"):
    """The first line on stdout: the engine is loaded and takes requests."""

    model: str
    max_model_len: int


async def read_fd(fd: int) -> bytes:
    """Up to 64 KiB from fd, b"" at EOF. A thread read works on pipes, files, ttys and /dev/null alike."""
    return await trio.to_thread.run_sync(os.read, fd, 65536, abandon_on_cancel=True)


async def write_fd(fd: int, data: bytes) -> None:
    """All of data to fd (blocking writes in a thread: a host that stops reading stalls only this)."""

    def write_all() -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    await trio.to_thread.run_sync(write_all, abandon_on_cancel=True)


class LineReader:
    """Splits what read_fd returns into lines (without the newline); a last unterminated line counts."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()
        self.eof = False

    async def readline(self) -> bytes | None:
        """The next line, or None at EOF. Overlong lines come back truncated to MAX_LINE + 1 bytes."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                return line
            if self.eof:
                if self.buf:
                    line, self.buf = bytes(self.buf), bytearray()
                    return line
                return None
            if len(self.buf) > MAX_LINE:
                line = bytes(self.buf[: MAX_LINE + 1])
                await self._skip_rest()
                return line
            chunk = await read_fd(self.fd)
            if not chunk:
                self.eof = True
            self.buf += chunk

    async def _skip_rest(self) -> None:
        """Drop input up to and including the next newline (the tail of an overlong line);
        what follows that newline stays in the buffer."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                del self.buf[: nl + 1]
                return
            self.buf.clear()
            chunk = await read_fd(self.fd)
            if not chunk:
                self.eof = True
                return
            self.buf += chunk


class StdioRelay:
    """Moves requests from JSON lines to the engine and events back to JSON lines.

    One task reads stdin, one writes stdout (events queue in an unbounded channel), one
    sends to the engine and one receives from it. `open_ids` holds the request ids sent
    and not yet ended; at EOF the relay waits until it is empty.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], frontend: str, stdin_fd: int, stdout_fd: int):
        self.sock = AsyncSocket(ctx, zmq.DEALER, connect=frontend)
        self.stdin = LineReader(stdin_fd)
        self.stdout_fd = stdout_fd
        self.json_requests = msgspec.json.Decoder(ClientRequest)
        self.json_encoder = msgspec.json.Encoder()
        self.wire: Codec[ClientRequest] = Codec(ClientRequest)
        self.events: Codec[ClientEvent] = Codec(ClientEvent)
        self.out_tx, self.out_rx = trio.open_memory_channel[bytes](float("inf"))
        self.req_tx, self.req_rx = trio.open_memory_channel[ClientRequest](float("inf"))
        self.open_ids: set[str] = set()
        self.stdin_closed = False
        self.all_done = trio.Event()  # set once stdin is closed and no request is open
        self.writer_done = trio.Event()
        self.sender_done = trio.Event()
        self.line_no = 0

    def write(self, event: msgspec.Struct) -> None:
        """Queue one event as a JSON line on stdout."""
        self.out_tx.send_nowait(self.json_encoder.encode(event) + b"\n")

    async def run(self, ready: Ready) -> None:
        """Relay until stdin ends and every open request has ended."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self._write_stdout)
                nursery.start_soon(self._send_engine)
                nursery.start_soon(self._recv_engine)
                self.write(ready)
                await self._read_stdin()
                log.info("stdin closed", open_requests=len(self.open_ids))
                self.stdin_closed = True
                self._check_done()
                await self.all_done.wait()
                self.out_tx.close()  # the writer drains what is queued, then returns
                with trio.move_on_after(5.0):  # a host that stopped reading
                    await self.writer_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.sock.close()

    def _check_done(self) -> None:
        if self.stdin_closed and not self.open_ids:
            self.all_done.set()

    async def _read_stdin(self) -> None:
        while (line := await self.stdin.readline()) is not None:
            self.line_no += 1
            if line.strip():
                self.handle_line(line)

    def handle_line(self, line: bytes) -> None:
        """Validate one request line and forward it, or answer it with a rejected event."""
        if len(line) > MAX_LINE:
            self._reject(None, f"line {self.line_no}: longer than {MAX_LINE} bytes")
            return
        try:
            req = self.json_requests.decode(line)
        except msgspec.ValidationError as exc:  # (a MsgspecError: test it first)
            self._reject(request_id_of(line, "json"), f"line {self.line_no}: {validation_message(exc, line)}")
            return
        except msgspec.MsgspecError as exc:
            self._reject(request_id_of(line, "json"), f"line {self.line_no}: {exc}")
            return
        except RecursionError:  # msgspec recurses per nesting level (skipping a field before "type" too)
            self._reject(None, f"line {self.line_no}: nested too deeply")
            return
        if not isinstance(req, Cancel):
            if req.request_id in self.open_ids:
                self._reject(None, f"line {self.line_no}: request_id {req.request_id!r} is already in use")
                return
            self.open_ids.add(req.request_id)
        self.req_tx.send_nowait(req)

    def _reject(self, request_id: str | None, message: str) -> None:
        log.warning("bad request line", line=self.line_no, message=message)
        self.write(Rejected(request_id or "", "bad_request", message))

    async def _send_engine(self) -> None:
        try:
            async for req in self.req_rx:
                await self.sock.send(self.wire.encode(req))
        finally:
            self.sender_done.set()

    async def _recv_engine(self) -> None:
        while True:
            event = self.events.decode(await self.sock.recv())
            self.write(event)
            if isinstance(event, TERMINAL_EVENTS):
                self.open_ids.discard(event.request_id)
                self._check_done()

    async def _write_stdout(self) -> None:
        try:
            async for line in self.out_rx:
                await write_fd(self.stdout_fd, line)
        except BrokenPipeError:
            await self._host_gone()
        finally:
            self.writer_done.set()

    async def _host_gone(self) -> None:
        """Our stdout was closed: cancel every open request, then end the relay."""
        log.warning("stdout closed by the host: cancelling open requests and exiting",
                    open_requests=len(self.open_ids))
        for rid in self.open_ids:
            self.req_tx.send_nowait(Cancel(rid))
        self.req_tx.close()  # the sender sends the cancels, then returns
        with trio.move_on_after(2.0):
            await self.sender_done.wait()
        self.nursery.cancel_scope.cancel()


def stdio_main(args: argparse.Namespace, relay: Callable[[argparse.Namespace, int], None] | None = None) -> int:
    """Run the engine as a stdin/stdout JSON-lines server until stdin ends; exit status.
    relay: what serves the protocol on the file descriptor given it (default: one engine in
    this process; `--replicas`: gateway/serve_replicas.py's router over Ray replicas)."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # from here on, anything printed to fd 1 lands on stderr
    sys.stdout = sys.stderr
    if relay is not None:
        relay(args, protocol_fd)
    else:
        trio.run(_stdio, args, protocol_fd)
    return 0


async def _stdio(args: argparse.Namespace, protocol_fd: int) -> None:
    config = engine_config(args)
    async with open_engine(config) as engine:
        ready = Ready(model=engine.source.name, max_model_len=engine.max_model_len)
        log.info("stdio ready", model=ready.model)
        await StdioRelay(engine.ctx, engine.addrs.frontend, 0, protocol_fd).run(ready)
