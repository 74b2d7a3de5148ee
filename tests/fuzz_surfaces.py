"""The fuzz suite's side of each way in: send one case, collect every reply, check the contract.

Each `*_case` function sends one fuzz case through a real client (httpx, websockets,
a ZeroMQ DEALER; `zinfer stdio` is in fuzz_stdio.py) and raises AssertionError naming
the input when a property breaks: a 5xx, a request with no terminal event or more than
one, an event after a request's terminal, a stall. The `*_leave_case` functions walk
away mid-stream instead. `ServerUnderTest` restarts a server that died, so the example
that killed it fails by itself and later examples still run.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from pathlib import Path

import httpx
import msgspec
import zmq
from hypothesis import event as note_event
from websockets.sync.client import connect

from zinfer.gateway.websocket import WsCancel, WsPing, WsRequest
from zinfer.messages.client import Cancel, ClientRequest
from fuzz_strategies import to_json
from http_server import Server, running_server

ENGINE_TERMINALS = {"finished", "cancelled", "rejected", "failed", "tokenized", "stats"}
WS_TERMINALS = {"done", "cancelled", "error"}
REPLY_TIMEOUT = 30.0  # seconds for every reply of one case on the tiny model: longer is a stall (15 s flaked at load 8)
GREEDY = {"prompt": "the cat is", "max_tokens": 4, "temperature": 0}  # under one KV block: no prefix cache


class Ledger:
    """Terminal events expected and seen in one case, by request id ("" / None: not attributable).

    A request gets exactly one terminal, so the totals must match; no id may get more
    terminals than requests carrying it, and no event may follow an id's last terminal.
    """

    def __init__(self, case: object):
        self.case = case
        self.expected = 0
        self.sent: Counter = Counter()
        self.seen: Counter = Counter()

    def request(self, rid: object, expects_terminal: bool) -> None:
        self.sent[rid if isinstance(rid, str) else None] += 1
        self.expected += expects_terminal

    def event(self, rid: object, terminal: bool, event: dict) -> None:
        key = rid if isinstance(rid, str) and rid else None
        if key is not None:
            assert key in self.sent, f"an event for an id never sent: {event}\ncase: {self.case!r}"
            assert self.seen[key] < self.sent[key], (f"an event after the id's last terminal: {event}\n"
                                                     f"case: {self.case!r}")
        self.seen[key] += terminal
        if terminal:
            # --hypothesis-show-statistics
            note_event(f"terminal: {event.get('type')} {event.get('code', '')}".rstrip())
        assert self.total <= self.expected, (f"more terminal events than requests ({self.total} > {self.expected}); "
                                             f"last {event}\ncase: {self.case!r}")

    @property
    def total(self) -> int:
        return sum(self.seen.values())

    def done(self) -> bool:
        return self.total == self.expected

    def missing(self) -> str:
        return (f"{self.expected - self.total} request(s) got no terminal event in time (seen {dict(self.seen)})\n"
                f"case: {self.case!r}")


# ---- the HTTP server ------------------------------------------------------------------


class ServerUnderTest:
    """A `zinfer serve` for fuzzing, started again if an example killed it."""

    def __init__(self, model: Path | str, *args: str, timeout: float = REPLY_TIMEOUT):
        """timeout: seconds every reply of one case may take (longer is a stall)."""
        self.model, self.args, self.timeout = model, args, timeout
        self.stack = contextlib.ExitStack()
        self.server: Server = self.stack.enter_context(running_server(model, *args))
        self.http = httpx.Client(base_url=self.server.url, timeout=timeout)
        self.reference = self.greedy()
        self.restarts = 0

    def alive(self) -> bool:
        try:
            return self.http.get("/health", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    def ensure_alive(self) -> Server:
        """The server, restarted first if it no longer answers."""
        if not self.alive():
            self.stack.close()
            self.stack = contextlib.ExitStack()
            self.server = self.stack.enter_context(running_server(self.model, *self.args))
            self.http = httpx.Client(base_url=self.server.url, timeout=self.timeout)
            self.restarts += 1
        return self.server

    def run_case(self, check, *args, case: object) -> None:
        """check(*args), naming the case and the server's log when the server died during it."""
        try:
            check(*args)
        except Exception as exc:
            if not self.alive():
                raise AssertionError(f"the server died on this case:\ncase: {case!r}\n"
                                     f"log:\n{self.server.log_tail(3000)}") from exc
            raise

    def greedy(self) -> str:
        r = self.http.post("/v1/completions", json=GREEDY)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    def check_healthy(self, case: object) -> None:
        """The process lives, is idle with no sequence or KV block held, and answers as before."""
        assert self.alive(), f"the server died on this case:\ncase: {case!r}\nlog:\n{self.server.log_tail(3000)}"
        m = self.server.wait_idle(timeout=30)
        held = {k: m[k] for k in ("zinfer_requests_in_flight", "zinfer_engine_open_requests",
                                  "zinfer_running_sequences", "zinfer_queue_depth", "zinfer_kv_used_blocks")}
        assert not any(held.values()), f"not idle after the case: {held}\ncase: {case!r}"
        assert self.greedy() == self.reference, f"greedy text changed after the case\ncase: {case!r}"

    def close(self) -> None:
        self.http.close()
        self.stack.close()


def http_case(sut: ServerUnderTest, method: str, route: str, body: bytes = b"") -> None:
    """One HTTP request: never a 5xx; a 200 completion ends each choice once (a stream with [DONE])."""
    case = (method, route, body[:2000])
    try:
        r = sut.http.request(method, route, content=body, headers={"content-type": "application/json"})
    except httpx.TimeoutException:
        raise AssertionError(f"no answer within {sut.timeout} s\ncase: {case!r}") from None
    except httpx.TransportError as exc:
        raise AssertionError(f"the connection failed: {exc!r}\ncase: {case!r}") from None
    note_event(f"HTTP {r.status_code}")
    assert r.status_code < 500, f"HTTP {r.status_code}: {r.text[:500]}\ncase: {case!r}"
    if r.status_code != 200 or "completions" not in route:
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        payloads = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert payloads and payloads[-1] == "[DONE]", f"stream not ended by [DONE]: {payloads[-3:]}\ncase: {case!r}"
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert not [c for c in chunks if "error" in c], f"error in a 200 stream: {chunks}\ncase: {case!r}"
        ends = Counter(ch["index"] for c in chunks for ch in c["choices"] if ch.get("finish_reason"))
        indexes = {ch["index"] for c in chunks for ch in c["choices"]}
        assert indexes and all(ends[i] == 1 for i in indexes), (f"finish_reason per choice: {dict(ends)} of {indexes}\n"
                                                                f"case: {case!r}")
    else:
        choices = r.json()["choices"]
        assert choices and all(c["finish_reason"] in ("stop", "length") for c in choices), f"{choices}\ncase: {case!r}"


def http_leave_case(sut: ServerUnderTest, route: str, body: bytes) -> None:
    """Start a streamed request and leave after its first line: never a 5xx (check_healthy then sees nothing held)."""
    with sut.http.stream("POST", route, content=body, headers={"content-type": "application/json"}) as r:
        assert r.status_code < 500, f"HTTP {r.status_code}\ncase: {(route, body[:2000])!r}"
        next(r.iter_lines(), None)


# ---- the websocket ----------------------------------------------------------------------

_WS = msgspec.json.Decoder(WsRequest)


def ws_expects(message: object) -> tuple[object, bool, int]:
    """(the id it names, whether it must get a done/cancelled/error, pongs it gets)."""
    message = _ws_frame(message) if isinstance(message, str) else message
    if isinstance(message, bytes):
        return None, True, 0
    text = message if isinstance(message, str) else None
    try:
        parsed = _WS.decode(text if text is not None else _json_text(message))
    except (msgspec.MsgspecError, RecursionError):
        parsed = None
    rid = message.get("id") if isinstance(message, dict) else None
    if isinstance(parsed, WsPing):
        return None, False, 1
    return rid, not isinstance(parsed, WsCancel), 0


def _json_text(obj: object) -> str:
    return to_json(obj).decode()


def _ws_frame(message: object) -> str | bytes:
    """What to send for one drawn message: text as is (lone surrogates, which no text frame
    carries, as a binary frame of their bytes), bytes as a binary frame, anything else as JSON."""
    if isinstance(message, str):
        try:
            message.encode()
        except UnicodeEncodeError:
            return message.encode("utf-8", "surrogatepass")
        return message
    return message if isinstance(message, bytes) else _json_text(message)


def ws_case(server: Server, messages: list, timeout: float = REPLY_TIMEOUT) -> None:
    """Send a burst of websocket messages; each generate (and each bad message) gets exactly one terminal."""
    ledger = Ledger(messages)
    pongs_expected = 0
    with connect(server.ws, max_size=None, open_timeout=30) as ws:
        for m in messages:
            rid, terminal, pongs = ws_expects(m)
            ledger.request(rid, terminal)
            pongs_expected += pongs
            ws.send(_ws_frame(m))
        deadline = time.monotonic() + timeout
        pongs, barrier = 0, False
        while True:
            if ledger.done() and pongs == pongs_expected and not barrier:
                ws.send('{"type": "ping"}')  # answered after anything still queued for this socket
                barrier = True
            try:
                ev = json.loads(ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            except TimeoutError:
                raise AssertionError(ledger.missing()) from None
            if ev["type"] == "pong":
                pongs += 1
                if barrier:
                    return
                continue
            ledger.event(ev.get("id"), ev["type"] in WS_TERMINALS, ev)


def ws_leave_case(server: Server, messages: list) -> None:
    """Send a burst and close the socket after the first reply: its generations must be cancelled."""
    with connect(server.ws, max_size=None, open_timeout=30) as ws:
        for m in messages:
            ws.send(_ws_frame(m))
        ws.send('{"type": "ping"}')  # so some reply comes even to a burst of cancels
        ws.recv(timeout=REPLY_TIMEOUT)


def zmq_leave_case(ctx: zmq.Context, server: Server, frames: list[bytes]) -> None:
    """Send a burst on a fresh DEALER and close it after the first event: the engine must drop its requests."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.zmq)
    try:
        for f in frames:
            sock.send(f)
        sock.send(msgspec.msgpack.encode({"type": "stats", "request_id": "@first"}))  # so some event comes
        assert sock.poll(REPLY_TIMEOUT * 1000), "no event at all"
        sock.recv()
    finally:
        sock.close()


# ---- the ZeroMQ endpoint ----------------------------------------------------------------


def engine_expects(request: object, decode) -> tuple[object, bool]:
    """(its request id, whether it must get a terminal event): all but a well-formed cancel do."""
    try:
        parsed = decode()
    except (msgspec.MsgspecError, RecursionError):
        parsed = None
    rid = request.get("request_id") if isinstance(request, dict) else None
    return rid, not isinstance(parsed, Cancel)


_MSGPACK = msgspec.msgpack.Decoder(ClientRequest)


def zmq_case(ctx: zmq.Context, server: Server, frames: list[bytes | list[bytes]], case: object,
             timeout: float = REPLY_TIMEOUT) -> None:
    """Send a burst of frames on a fresh DEALER; every request but a cancel gets one terminal event."""
    ledger = Ledger(case)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.zmq)
    try:
        for f, request in zip(frames, case):
            if isinstance(f, list):  # several frames in one message: malformed whatever they hold
                ledger.request(None, True)
                sock.send_multipart(f)
                continue
            ledger.request(*engine_expects(request, lambda: _MSGPACK.decode(f)))
            sock.send(f)
        barrier = False
        deadline = time.monotonic() + timeout
        while True:
            if ledger.done() and not barrier:
                sock.send(msgspec.msgpack.encode({"type": "stats", "request_id": "@barrier"}))
                barrier = True
            remaining = deadline - time.monotonic()
            assert remaining > 0 and sock.poll(remaining * 1000), ledger.missing()
            ev = msgspec.msgpack.decode(sock.recv())
            if ev.get("request_id") == "@barrier":
                return
            ledger.event(ev.get("request_id"), ev.get("type") in ENGINE_TERMINALS, ev)
    finally:
        sock.close()
