"""Out-of-range values over ZeroMQ, the websocket and stdio, against real `zinfer serve` and
`zinfer stdio` processes: each bad request gets exactly one refusal naming the field, and
the process lives on and gives a greedy request the same text as before.

Before, an integer outside 64 bits (or seed 2**64-1 with n=2, whose second choice's seed
is 2**64) raised OverflowError in a msgpack encoder and the whole process exited.
"""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
import zmq
from http_server import running_server
from test_stdio import Stdio
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "max_tokens": 6}
QUESTION = [{"role": "user", "content": "Name a fruit."}]
TERMINAL = ("finished", "cancelled", "rejected", "failed", "tokenized", "stats")
DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(smollm2_path, "--max-model-len", "256") as s:
        yield s


class RawDealer:
    """A plain pyzmq DEALER speaking msgpack maps by hand, as a client in another language would."""

    def __init__(self, address: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 120_000)
        self.sock.connect(address)
        self.probes = 0

    def send(self, request: dict | bytes) -> None:
        self.sock.send(request if isinstance(request, bytes) else msgspec.msgpack.encode(request))

    def until(self, request_id: str) -> list[dict]:
        """Events received up to and including request_id's terminal."""
        out = []
        while True:
            out.append(msgspec.msgpack.decode(self.sock.recv()))
            if out[-1].get("request_id") == request_id and out[-1]["type"] in TERMINAL:
                return out

    def answers_to(self, request: dict | bytes) -> list[dict]:
        """Every event the engine sends at once for request (a refusal): a stats probe sent after it marks the end."""
        self.probes += 1
        probe = f"probe-{self.probes}"
        self.send(request)
        self.send({"type": "stats", "request_id": probe})
        return self.until(probe)[:-1]

    def greedy_text(self, request_id: str) -> str:
        self.send({"type": "generate", "request_id": request_id, "messages": QUESTION, "params": GREEDY})
        events = self.until(request_id)
        assert events[-1]["type"] == "finished", events[-1]
        return "".join(e.get("text", "") for e in events if e["type"] == "delta")


def assert_alive(server) -> None:
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}  # the process is still there


def test_zmq_out_of_range_values_get_one_rejection_each(server):
    client = RawDealer(server.zmq)
    try:
        reference = client.greedy_text("ref")
        nested = msgspec.msgpack.encode({"type": "generate", "request_id": "deep", "prompt": "Hi"})
        # a 4th field, 5000 deep
        nested = b"\x84" + nested[1:] + msgspec.msgpack.encode("messages") + b"\x91" * 5000 + b"\xc0"
        bad = [
            # (request, words in the rejection)
            # 10**30 as a JS client sends it
            ({"type": "generate", "request_id": "s", "prompt": "Hi", "params": {"seed": 1e30}}, "params.seed"),
            # the largest int msgpack carries
            ({"type": "generate", "request_id": "t", "prompt_ids": [1, 2**64 - 1]}, "prompt_ids[1]"),
            ({"type": "generate", "request_id": "k", "prompt": "Hi", "params": {"top_k": 2**64 - 1}}, "params.top_k"),
            ({"type": "detokenize", "request_id": "d", "token_ids": [2**64 - 1]}, "token_ids[0]"),
            ({"type": "generate", "request_id": "r" * 300, "prompt": "Hi"}, "request_id"),
            (nested, "messages"),
        ]
        for request, words in bad:
            events = client.answers_to(request)
            assert (len(events) == 1 and events[0]["type"] == "rejected"
                    and events[0]["code"] == "bad_request"), (words, events)
            assert words in events[0]["message"], events[0]
            if isinstance(request, dict) and len(request["request_id"]) <= 256:  # the client can match its refusal
                assert events[0]["request_id"] == request["request_id"], events[0]
            assert_alive(server)
            assert client.greedy_text(f"after-{words}") == reference, words
        # a seed in unsigned 64-bit range with n=2: choice 1's seed is seed + 1, which must still encode
        client.send({"type": "generate", "request_id": "u", "prompt": "Hi",
                     "params": {"seed": 2**64 - 1, "n": 2, "max_tokens": 2}})
        two = client.until("u")
        assert two[-1]["type"] == "finished" and len(two[-1]["finish_reasons"]) == 2, two[-1]
        assert_alive(server)
        assert client.greedy_text("after-u") == reference
    finally:
        client.sock.close()


def recv(ws) -> dict:
    return json.loads(ws.recv(timeout=120))


def ws_greedy_text(ws, id_: str) -> str:
    ws.send(json.dumps({"type": "generate", "id": id_, "messages": QUESTION, "params": GREEDY}))
    text = []
    while (m := recv(ws))["type"] != "done":
        assert m["type"] in ("started", "delta") and m["id"] == id_, m
        text.append(m.get("text", ""))
    return "".join(text)


def test_websocket_out_of_range_values_get_one_error_each(server):
    def gen(id_: str, **extra) -> str:
        return json.dumps({"type": "generate", "id": id_, "prompt": "Hi", **extra})

    bad = [
        # (message, the error's id, words in it)
        (gen("seed", params={"seed": 10**30}), "seed", "seed"),
        (gen("topk", params={"top_k": 2**64}), "topk", "top_k"),
        (gen("bias", params={"logit_bias": {str(2**70): 1}}), "bias", "logit_bias"),
        (json.dumps({"type": "generate", "id": "many", "messages": [{"role": "user", "content": "Hi"}] * 1025}),
         "many", "messages"),
        (gen("i" * 300), "i" * 300, "length <= 200 - at `$.id`"),
        ('{"type": "generate", "id": "deep", "prompt": "Hi", "params": ' + DEEP + "}", None, "nested too deeply"),
        ('{"type": "generate", "id": "deeper", "prompt": "Hi", "extra": ' + DEEP + "}", None, "nested too deeply"),
        ("[x", None, "not a JSON message"),  # the typed decoder stops at "[", the untyped one read on and raised
        ("1x", None, "not a JSON message"),
        # skipping a field before the tag recurses too
        ('{"id": ' + DEEP + ', "type": "cancel"}', None, "nested too deeply"),
        (gen("binary").encode(), None, "binary frames"),  # receive_text raised KeyError: the socket closed with 1011
    ]
    with connect(server.ws, open_timeout=30) as ws:
        reference = ws_greedy_text(ws, "ref")
        for message, id_, words in bad:
            ws.send(message)  # a bytes message goes as a binary frame
            m = recv(ws)
            assert m["type"] == "error" and m["id"] == id_ and words in m["message"], (words, m)
            ws.send(json.dumps({"type": "ping"}))
            assert recv(ws)["type"] == "pong"  # one error, nothing after it
            assert_alive(server)
            assert ws_greedy_text(ws, f"after-{words}") == reference, words


def test_stdio_out_of_range_values_get_one_rejection_each(smollm2_path):
    z = Stdio(smollm2_path)

    def greedy(rid: str) -> str:
        z.write(json.dumps({"type": "generate", "request_id": rid, "messages": QUESTION, "params": GREEDY}))
        text = []
        while (ev := z.read())["type"] != "finished":
            assert ev["type"] in ("started", "delta") and ev["request_id"] == rid, ev
            text.append(ev.get("text", ""))
        return "".join(text)

    bad = [
        # (line, the rejection's request_id, words in it)
        (json.dumps({"type": "generate", "request_id": "s", "prompt": "Hi", "params": {"seed": 10**30}}), "s", "seed"),
        (json.dumps({"type": "generate", "request_id": "t", "prompt_ids": [2**64]}), "t", "prompt_ids"),
        (json.dumps({"type": "generate", "request_id": "n", "prompt": "Hi", "params": {"n": 2**64}}), "n", "params.n"),
        (json.dumps({"type": "detokenize", "request_id": "d", "token_ids": [10**30]}), "d", "token_ids"),
        ('{"type": "generate", "request_id": "deep", "messages": ' + DEEP + "}", "", "messages"),
        # skipping a field before the tag recurses
        ('{"request_id": ' + DEEP + ', "type": "cancel"}', "", "nested too deeply"),
    ]
    try:
        assert z.read()["type"] == "ready"
        reference = greedy("ref")
        for line, rid, words in bad:
            z.write(line)
            ev = z.read()
            assert ev["type"] == "rejected" and ev["request_id"] == rid and words in ev["message"], (words, ev)
            assert greedy(f"after-{rid}") == reference, words  # alive, and nothing else came for the bad line
        z.proc.stdin.close()
        assert z.proc.wait(60) == 0
    finally:
        if z.proc.poll() is None:
            z.proc.kill()
            z.proc.wait()
