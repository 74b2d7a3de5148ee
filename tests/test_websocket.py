"""The /v1/ws chat protocol against a real `zinfer serve` (hypercorn + engine) and a real websocket client."""

from __future__ import annotations

import json
import time

import pytest
from websockets.sync.client import connect

from zinfer.gateway.client import Client
from zinfer.messages.client import Delta, EngineStats, Finished, GetStats
from zinfer.messages.params import SamplingParams
from http_server import running_server
from tiny import write_tiny_gguf


TERMINAL = ("done", "cancelled", "error")
HI = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def server(request, tmp_path_factory):
    """The protocol on a tiny random llama (fast tier) and on SmolLM2 (slow tier)."""
    if request.param == "tiny":
        path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama", max_position_embeddings=1024)
    else:
        path = request.getfixturevalue("smollm2_path")
    with running_server(path, "--max-running", "8") as s:
        yield s


def engine_text(server, messages, max_tokens) -> str:
    """The engine's own greedy answer over ZeroMQ, the reference for what the socket streams."""
    with Client(server.zmq, timeout_s=120) as c:
        text = []
        for ev in c.generate(messages=messages, params=SamplingParams(temperature=0.0, max_tokens=max_tokens)):
            if isinstance(ev, Delta):
                text.append(ev.text)
            assert not isinstance(ev, Finished) or ev.finish_reasons
        return "".join(text)


def recv(ws) -> dict:
    return json.loads(ws.recv(timeout=120))


def until_terminal(ws, ids: set[str]) -> dict[str, list[dict]]:
    """Every message of the given generation ids until each has ended; then check none follows."""
    got: dict[str, list[dict]] = {i: [] for i in ids}
    open_ = set(ids)
    while open_:
        m = recv(ws)
        assert m.get("id") in ids, m
        assert m["id"] in open_, f"message after the terminal: {m}"
        got[m["id"]].append(m)
        if m["type"] in TERMINAL:
            open_.discard(m["id"])
    ws.send(json.dumps({"type": "ping"}))
    while (m := recv(ws))["type"] != "pong":
        raise AssertionError(f"message after every terminal: {m}")
    return got


def generate(id_, messages=HI, **params) -> str:
    return json.dumps({"type": "generate", "id": id_, "messages": messages, "params": params})


def test_ping_pong(server):
    with connect(server.ws) as ws:
        ws.send('{"type": "ping"}')
        assert recv(ws) == {"type": "pong"}


def test_greedy_stream_equals_engine_output(server):
    with connect(server.ws) as ws:
        ws.send(generate("g1", temperature=0, max_tokens=12))
        msgs = until_terminal(ws, {"g1"})["g1"]
    kinds = [m["type"] for m in msgs]
    assert kinds[0] == "started" and kinds[-1] == "done" and set(kinds[1:-1]) == {"delta"}
    text = "".join(m["text"] for m in msgs if m["type"] == "delta")
    assert text and text == engine_text(server, HI, 12)
    done = msgs[-1]
    assert done["finish_reason"] in ("stop", "length")
    assert done["usage"]["completion_tokens"] >= 1 and done["usage"]["prompt_tokens"] == msgs[0]["prompt_tokens"]


def test_generations_multiplex_on_one_socket(server):
    other = [{"role": "user", "content": "Name a colour."}]
    with connect(server.ws) as ws:
        ws.send(generate("a", temperature=0, max_tokens=10))
        ws.send(generate("b", messages=other, temperature=0, max_tokens=10))
        ws.send(json.dumps({"type": "generate", "id": "c", "prompt": "1, 2, 3,",
                            "params": {"temperature": 0, "max_tokens": 6}}))
        got = until_terminal(ws, {"a", "b", "c"})
    for id_, msgs in got.items():
        assert [m["type"] for m in msgs].count("done") == 1, (id_, msgs)
        assert "".join(m["text"] for m in msgs if m["type"] == "delta"), id_


def test_cancel_ends_with_one_cancelled(server):
    with connect(server.ws) as ws:
        ws.send(generate("long", temperature=0, max_tokens=400, ignore_eos=True))
        while recv(ws)["type"] != "delta":
            pass
        ws.send('{"type": "cancel", "id": "long"}')
        msgs = until_terminal(ws, {"long"})["long"]
    assert msgs[-1] == {"type": "cancelled", "id": "long"}
    assert all(m["type"] == "delta" for m in msgs[:-1])


def test_bad_messages_get_errors_and_the_socket_stays_open(server):
    cases = [
        ("not json", None, "bad_json"),
        ('{"type": "launch", "id": "x"}', "x", "bad_message"),
        ('{"type": "generate", "id": "x"}', "x", "bad_message"),
        ('{"type": "generate", "id": "x", "prompt": "a", "params": {"temperature": -1}}', "x", "bad_request"),
        ('{"type": "generate", "id": "x", "prompt": "a", "params": {"top_p": "high"}}', "x", "bad_message"),
        ('{"type": "generate", "id": "x", "prompt": "a", "colour": "red"}', "x", "bad_message"),
    ]
    with connect(server.ws) as ws:
        for text, id_, code in cases:
            ws.send(text)
            m = recv(ws)
            assert m["type"] == "error" and m["id"] == id_ and m["code"] == code, (text, m)
            assert m["message"]
        # an id still running cannot be reused; the running generation is unaffected
        ws.send(generate("dup", temperature=0, max_tokens=20, ignore_eos=True))
        ws.send(generate("dup", temperature=0, max_tokens=5))
        msgs = [recv(ws)]
        while msgs[-1]["type"] not in ("done", "cancelled"):
            msgs.append(recv(ws))
        assert [(m["code"], m["id"]) for m in msgs if m["type"] == "error"] == [("id_in_use", None)], msgs
        assert msgs[-1]["type"] == "done" and msgs[-1]["usage"]["completion_tokens"] == 20


def test_engine_rejection_is_an_error_message(server):
    long_prompt = "word " * 9000  # past SmolLM2's own 8192-token context (and the tiny model's 1024)
    with connect(server.ws) as ws:
        ws.send(json.dumps({"type": "generate", "id": "big", "prompt": long_prompt}))
        msgs = until_terminal(ws, {"big"})["big"]
    assert msgs[-1]["type"] == "error" and msgs[-1]["code"] == "too_long", msgs


def open_requests(server) -> int:
    with Client(server.zmq, timeout_s=30) as c:
        c.send(GetStats("s"))
        (stats,) = list(c.events("s"))
        assert isinstance(stats, EngineStats)
        return stats.open_requests


def test_closing_the_socket_cancels_its_generations(server):
    with connect(server.ws) as ws:
        ws.send(generate("x1", temperature=0, max_tokens=1000, ignore_eos=True))  # the tiny model's context is 1024
        ws.send(generate("x2", temperature=0, max_tokens=1000, ignore_eos=True))
        seen = set()
        while seen != {"x1", "x2"}:
            m = recv(ws)
            if m["type"] == "delta":
                seen.add(m["id"])
        assert open_requests(server) == 2
    deadline = time.monotonic() + 10
    while (n := open_requests(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert n == 0


def test_an_overlong_id_then_its_cancel_get_errors_and_the_socket_stays_open(server):
    """Before, the generate's engine id (ws<N>.<id>) passed 256 characters, the cancel that
    followed raised EngineError out of the socket's nursery and the socket closed with 1011."""
    long_id, longest = "i" * 253, "j" * 200  # 253: past 256 with the shortest prefix, ws1.
    with connect(server.ws) as ws:
        ws.send(generate(long_id, temperature=0, max_tokens=400, ignore_eos=True))
        ws.send(json.dumps({"type": "cancel", "id": long_id}))
        first, second = recv(ws), recv(ws)
        assert (first["type"] == "error" and first["id"] == long_id and "200" in first["message"]
                and "id" in first["message"]), first
        # not a second terminal
        assert second["type"] == "error" and second["id"] is None and "200" in second["message"], second
        # the longest id works, and so does its cancel
        ws.send(generate(longest, temperature=0, max_tokens=400, ignore_eos=True))
        ws.send(json.dumps({"type": "cancel", "id": longest}))
        msgs = until_terminal(ws, {longest})[longest]
    assert msgs[-1] == {"type": "cancelled", "id": longest}, msgs


def test_a_huge_seed_is_named_with_the_generations_id(server):
    """Before, a seed of 5,000 digits (past Python's 4300-digit limit) was "not a JSON message" with id null."""
    with connect(server.ws) as ws:
        for digits in ("9" * 5000, "-" + "9" * 5000):
            ws.send('{"type": "generate", "id": "s", "prompt": "Hi", "params": {"seed": %s}}' % digits)
            m = recv(ws)
            assert m["type"] == "error" and m["id"] == "s" and "seed" in m["message"] and "range" in m["message"], m
            assert "JSON" not in m["message"], m
        ws.send('{"type": "cancel", "id": "c", "extra": %s}' % ("1" * 5000))
        m = recv(ws)
        assert m["type"] == "error" and m["id"] is None and "extra" in m["message"], m
        ws.send(generate("after", temperature=0, max_tokens=3))
        assert until_terminal(ws, {"after"})["after"][-1]["type"] == "done"
