"""The fuzz suite's side of each way in: send one case, collect every reply, check the contract.

Each `*_case` function sends one fuzz case through a real client (httpx, websockets,
a ZeroMQ DEALER, a `zinfer stdio` pipe) and raises AssertionError naming the input
when a property breaks: a 5xx, a request with no terminal event or more than one, an
event after a request's terminal, a stall. `ServerUnderTest` restarts a server that
died, so the example that killed it fails by itself and later examples still run.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
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
REPLY_TIMEOUT = 15.0  # seconds for every reply of one case on the tiny model: longer is a stall
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
            assert self.seen[key] < self.sent[key], f"an event after the id's last terminal: {event}\ncase: {self.case!r}"
        self.seen[key] += terminal
        if terminal:
            note_event(f"terminal: {event.get('type')} {event.get('code', '')}".rstrip())  # --hypothesis-show-statistics
        assert self.total <= self.expected, f"more terminal events than requests ({self.total} > {self.expected}); last {event}\ncase: {self.case!r}"

    @property
    def total(self) -> int:
        return sum(self.seen.values())

    def done(self) -> bool:
        return self.total == self.expected

    def missing(self) -> str:
        return f"{self.expected - self.total} request(s) got no terminal event in time (seen {dict(self.seen)})\ncase: {self.case!r}"


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
                raise AssertionError(f"the server died on this case:\ncase: {case!r}\nlog:\n{self.server.log_tail(3000)}") from exc
            raise

    def greedy(self) -> str:
        r = self.http.post("/v1/completions", json=GREEDY)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    def check_healthy(self, case: object) -> None:
        """The process lives, is idle with no sequence or KV block held, and answers as before."""
        assert self.alive(), f"the server died on this case:\ncase: {case!r}\nlog:\n{self.server.log_tail(3000)}"
        m = self.server.wait_idle(timeout=30)
        held = {k: m[k] for k in ("zinfer_requests_in_flight", "zinfer_engine_open_requests", "zinfer_running_sequences", "zinfer_queue_depth", "zinfer_kv_used_blocks")}
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
        assert indexes and all(ends[i] == 1 for i in indexes), f"finish_reason per choice: {dict(ends)} of {indexes}\ncase: {case!r}"
    else:
        choices = r.json()["choices"]
        assert choices and all(c["finish_reason"] in ("stop", "length") for c in choices), f"{choices}\ncase: {case!r}"


# ---- the websocket ----------------------------------------------------------------------

_WS = msgspec.json.Decoder(WsRequest)


def ws_expects(message: object) -> tuple[object, bool, int]:
    """(the id it names, whether it must get a done/cancelled/error, pongs it gets)."""
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


def ws_case(server: Server, messages: list, timeout: float = REPLY_TIMEOUT) -> None:
    """Send a burst of websocket messages; each generate (and each bad message) gets exactly one terminal."""
    ledger = Ledger(messages)
    pongs_expected = 0
    with connect(server.ws, max_size=None, open_timeout=30) as ws:
        for m in messages:
            rid, terminal, pongs = ws_expects(m)
            ledger.request(rid, terminal)
            pongs_expected += pongs
            ws.send(m if isinstance(m, (str, bytes)) else _json_text(m))
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


def zmq_case(ctx: zmq.Context, server: Server, frames: list[bytes | list[bytes]], case: object, timeout: float = REPLY_TIMEOUT) -> None:
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


# ---- zinfer stdio -------------------------------------------------------------------------

_JSON_REQUEST = msgspec.json.Decoder(ClientRequest)


class StdioUnderTest:
    """`zinfer stdio` in a subprocess; a reader thread queues its stdout lines. Restarted if it died."""

    def __init__(self, model: Path | str):
        self.model = model
        self.restarts = self.syncs = 0
        self._start()
        self.reference = self.greedy()

    def _start(self) -> None:
        cmd = [sys.executable, "-m", "zinfer.gateway.cli", "stdio", "--model", str(self.model), "--max-running", "8"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[bytes] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        ready = self.next_event(120)
        assert ready["type"] == "ready", ready

    @staticmethod
    def _read(pipe, put) -> None:
        for line in pipe:
            put(line)
        put(b"")

    def ensure_alive(self) -> None:
        """Restart the process if it died; then drop every event left from earlier cases."""
        if self.proc.poll() is not None:
            self.restarts += 1
            self._start()
        self.drain()

    def drain(self, timeout: float = 60.0) -> None:
        """Read and drop events until the engine reports no open request (a failed case may leave some)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.syncs += 1
            rid = f"@sync{self.syncs}"
            self.write(json.dumps({"type": "stats", "request_id": rid}).encode())
            while (ev := self.next_event(REPLY_TIMEOUT)).get("request_id") != rid:
                pass
            if not ev.get("open_requests") and not ev.get("running"):
                return
            time.sleep(0.1)

    def run_case(self, check, *args, case: object) -> None:
        """check(*args), naming the case and stderr's tail when the process died during it."""
        try:
            check(*args)
        except Exception as exc:
            if self.proc.poll() is not None:
                raise AssertionError(f"zinfer stdio exited with {self.proc.returncode} on this case:\ncase: {case!r}\nstderr:\n{self.stderr_tail()}") from exc
            raise

    def stderr_tail(self) -> str:
        return b"".join(self.stderr)[-3000:].decode(errors="replace")

    def write(self, line: bytes) -> None:
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def next_event(self, timeout: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        if not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)  # stdout closes as the process exits: let run_case see the exit
            raise AssertionError(f"stdout closed (exit {self.proc.poll()}); stderr:\n{self.stderr_tail()}")
        return json.loads(line)

    def request(self, obj: dict) -> list[dict]:
        """Every event of one well-formed request, up to its terminal."""
        self.write(json.dumps(obj).encode())
        events = []
        while not events or events[-1]["type"] not in ENGINE_TERMINALS:
            events.append(self.next_event(REPLY_TIMEOUT))
        return events

    def greedy(self) -> str:
        params = {"temperature": 0, "max_tokens": GREEDY["max_tokens"]}
        events = self.request({"type": "generate", "request_id": "@greedy", "prompt": GREEDY["prompt"], "params": params})
        assert events[-1]["type"] == "finished", events
        return "".join(e.get("text", "") for e in events if e["type"] == "delta")

    def check_healthy(self, case: object) -> None:
        """The process lives, the engine is idle with no KV block held, and answers as before."""
        assert self.proc.poll() is None, f"zinfer stdio exited with {self.proc.returncode} on this case:\ncase: {case!r}\nstderr:\n{self.stderr_tail()}"
        deadline = time.monotonic() + 30
        while True:
            stats = self.request({"type": "stats", "request_id": "@stats"})[-1]
            held = {k: stats.get(k, 0) for k in ("running", "waiting", "kv_used_blocks", "open_requests")}
            if not any(held.values()):
                break
            assert time.monotonic() < deadline, f"not idle after the case: {held}\ncase: {case!r}"
            time.sleep(0.1)
        assert self.greedy() == self.reference, f"greedy text changed after the case\ncase: {case!r}"

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stdio_case(z: StdioUnderTest, lines: list[bytes], case: list) -> None:
    """Write a burst of lines; every line but a well-formed cancel gets exactly one terminal event."""
    ledger = Ledger(case)
    for line, request in zip(lines, case):
        ledger.request(*engine_expects(request, lambda: _JSON_REQUEST.decode(line)))
        z.write(line)
    deadline = time.monotonic() + REPLY_TIMEOUT
    barrier = False
    while True:
        if ledger.done() and not barrier:
            z.write(b'{"type": "stats", "request_id": "@barrier"}')  # answered after anything still queued
            barrier = True
        try:
            ev = z.next_event(max(deadline - time.monotonic(), 0.01))
        except TimeoutError:
            raise AssertionError(ledger.missing()) from None
        if ev.get("request_id") == "@barrier":
            return
        ledger.event(ev.get("request_id"), ev.get("type") in ENGINE_TERMINALS, ev)
