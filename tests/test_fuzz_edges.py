"""Fuzzing every way in: hostile values and garbage never make a 5xx, kill the process, lose a
request or leave the engine holding anything.

One tiny random-weight llama (tests/tiny.py) serves the module, fast enough for a few
hundred cases: the properties are the engine's, not the model's. After every case the
server must be alive, idle (no running sequence, no KV block in use, no open request)
and answer a greedy request with the same text as before the first case. One slow test
runs a smaller mix against the real SmolLM2 on cpu-fast.

A server (or `zinfer stdio`) that an example killed is started again before the next
example, so hypothesis reports the case that killed it, not the cases that found it dead.
"""

from __future__ import annotations

import socket
from urllib.parse import quote

import pytest
import zmq
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import fuzz_strategies as fs
from fuzz_stdio import StdioUnderTest, stdio_case
from fuzz_surfaces import ServerUnderTest, http_case, http_leave_case, ws_case, ws_leave_case, zmq_case, zmq_leave_case
from tiny import write_tiny_gguf

FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate, Phase.shrink])
POST_ROUTES = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("fuzz") / "tiny-llama.gguf", "llama", seed=5)


@pytest.fixture(scope="module")
def sut(tiny_model):
    s = ServerUnderTest(tiny_model, "--max-running", "8")
    yield s
    s.close()


@pytest.fixture(scope="module")
def zmq_ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.mark.slow  # 75-200 fuzzed requests: 5-25 s (halved for CI time; raise max_examples to fuzz longer)
@settings(max_examples=200, **FUZZ)
@given(request=st.sampled_from(POST_ROUTES).flatmap(lambda route: st.tuples(st.just(route), fs.http_body(route))))
@example(request=("/v1/completions", fs.to_json({"prompt": fs.Deep(100_000, "dict"), "max_tokens": 3})))  # found: 500
@example(request=("/v1/chat/completions",
                  fs.to_json({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "seed": 10**30})))
def test_http_routes_never_5xx(sut, request):
    route, body = request
    sut.ensure_alive()
    sut.run_case(http_case, sut, "POST", route, body, case=(route, body[:2000]))
    sut.check_healthy((route, body[:2000]))


@settings(max_examples=40, **FUZZ)
@given(route=st.sampled_from(POST_ROUTES[:2]),
       body=st.fixed_dictionaries({"prompt": st.sampled_from(["the cat", "a" * 300])},
                                  optional={"max_tokens": st.sampled_from([1, 200]), "ignore_eos": st.booleans(),
                                            "n": st.integers(1, 3)}))
@pytest.mark.slow  # 40-150 fuzzed requests against a server: 3-8 s
def test_http_client_leaving_a_stream_holds_nothing(sut, route, body):
    body = {**body, "stream": True}
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    sut.ensure_alive()
    sut.run_case(http_leave_case, sut, route, fs.to_json(body), case=(route, body))
    sut.check_healthy((route, body))


@pytest.mark.slow  # 40-150 fuzzed requests against a server: 3-8 s
@settings(max_examples=40, **FUZZ)
@given(messages=fs.ws_messages())
def test_websocket_closed_mid_generation_holds_nothing(sut, messages):
    sut.run_case(ws_leave_case, sut.ensure_alive(), messages, case=messages)
    sut.check_healthy(messages)


@settings(max_examples=60, **FUZZ)
@given(path=st.one_of(st.sampled_from(["/v1/models", "/health", "/metrics", "/", "/v1/ws"]),
                      st.text(max_size=30).map(lambda t: "/v1/models/" + quote(t))),
       method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]), body=fs.garbage_bytes())
@pytest.mark.slow  # 40-150 fuzzed requests against a server: 3-8 s
def test_other_routes_and_methods_never_5xx(sut, path, method, body):
    sut.ensure_alive()
    http_case(sut, method, path, body)
    sut.check_healthy((method, path, body))


@settings(max_examples=60, **FUZZ)
@given(raw=st.one_of(st.binary(min_size=1, max_size=200),
                    st.sampled_from([b"GET / HTTP/1.1\r\n\r\n",
                                     b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{",
                                     b"\r\n" * 100])))
@pytest.mark.slow  # 40-150 fuzzed requests against a server: 3-8 s
def test_raw_bytes_on_the_http_port(sut, raw):
    server = sut.ensure_alive()
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(raw)
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        try:
            while chunk := conn.recv(65536):
                reply += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert not reply.startswith(b"HTTP/1.1 5"), (raw, reply[:300])
    sut.check_healthy(raw)


@pytest.mark.slow  # 75-200 fuzzed requests: 5-25 s (halved for CI time; raise max_examples to fuzz longer)
@settings(max_examples=75, **FUZZ)
@given(messages=fs.ws_messages())
@example(messages=["0\x00"])  # found: a typed-decode error, then a raw decode that raises on the trailing byte
@example(messages=[{"type": fs.Deep(1000), "id": "a", "prompt": "x"}])
@example(messages=[{"type": "cancel", "id": "a"}, "\ud800"])  # text no text frame can carry: sent as binary
def test_websocket_one_terminal_per_generate(sut, messages):
    sut.run_case(ws_case, sut.ensure_alive(), messages, case=messages)
    sut.check_healthy(messages)


@settings(max_examples=40, **FUZZ)
@given(messages=st.lists(st.one_of(st.binary(max_size=64), st.just(b'{"type": "ping"}')), min_size=1, max_size=4))
@example(messages=[b'{"type": "ping"}'])
def test_websocket_binary_frames(sut, messages):
    sut.run_case(ws_case, sut.ensure_alive(), messages, case=messages)
    sut.check_healthy(messages)


@pytest.mark.slow  # 75-200 fuzzed requests: 5-25 s (halved for CI time; raise max_examples to fuzz longer)
@settings(max_examples=100, **FUZZ)
@given(case=fs.engine_requests("msgpack"),
       multipart=st.lists(st.lists(st.binary(max_size=16), min_size=2, max_size=3), max_size=1))
@example(case=[{"extra": 1, "request_id": fs.Deep(100_000), "type": "cancel"}],
         multipart=[])  # found: killed the engine
@example(case=[{"type": fs.Deep(1000), "request_id": "a", "params": {"max_tokens": 1}, "prompt": ""}], multipart=[])
def test_zmq_one_terminal_per_request(sut, zmq_ctx, case, multipart):
    frames = [r if isinstance(r, bytes) else fs.to_msgpack(r) for r in case] + multipart
    sut.run_case(zmq_case, zmq_ctx, sut.ensure_alive(), frames, case + multipart, case=case + multipart)
    sut.check_healthy(case + multipart)


@settings(max_examples=40, **FUZZ)
@given(case=fs.engine_requests("msgpack"))
def test_zmq_client_leaving_mid_generation_holds_nothing(sut, zmq_ctx, case):
    frames = [r if isinstance(r, bytes) else fs.to_msgpack(r) for r in case]
    sut.run_case(zmq_leave_case, zmq_ctx, sut.ensure_alive(), frames, case=case)
    sut.check_healthy(case)


@pytest.fixture(scope="module")
def stdio(tiny_model):
    z = StdioUnderTest(tiny_model)
    yield z
    z.close()


@pytest.mark.slow  # 75-200 fuzzed requests: 5-25 s (halved for CI time; raise max_examples to fuzz longer)
@settings(max_examples=75, **FUZZ)
@given(case=fs.engine_requests("json"))
@example(case=[{"type": fs.Deep(1000), "request_id": "a", "params": {"max_tokens": 1},
                "prompt": ""}])  # found: killed stdio
@example(case=[b"a" * (16 * 2**20 + 1), {"type": "stats", "request_id": "a"}])  # over stdio's 16 MiB line limit
def test_stdio_one_terminal_per_line(stdio, case):
    lines = [r.replace(b"\n", b" ") if isinstance(r, bytes) else fs.to_json(r) for r in case]
    lines = [line if line.strip() else b"{}" for line in lines]  # a blank line is skipped, not a request
    stdio.ensure_alive()
    stdio.run_case(stdio_case, stdio, lines, case, case=case)
    stdio.check_healthy(case)


@pytest.mark.slow
@settings(max_examples=12, **FUZZ)
@given(data=st.data())
def test_real_model_mix(smollm2_server, zmq_ctx, data):
    """The same properties on SmolLM2 (cpu-fast): a few HTTP bodies, websocket bursts and ZeroMQ bursts."""
    sut, t = smollm2_server, smollm2_server.timeout
    sut.ensure_alive()
    route, body = data.draw(st.sampled_from(POST_ROUTES).flatmap(lambda r: st.tuples(st.just(r), fs.http_body(r))),
                            label="http")
    sut.run_case(http_case, sut, "POST", route, body, case=(route, body[:2000]))
    messages = data.draw(fs.ws_messages(), label="ws")
    sut.run_case(ws_case, sut.ensure_alive(), messages, t, case=messages)
    case = data.draw(fs.engine_requests("msgpack"), label="zmq")
    sut.run_case(zmq_case, zmq_ctx, sut.ensure_alive(), [r if isinstance(r, bytes) else fs.to_msgpack(r) for r in case],
                 case, t, case=case)
    sut.check_healthy((route, body[:2000], messages, case))


@pytest.fixture(scope="module")
def smollm2_server(smollm2_path):
    # a 128-token context bounds a generation whose max_tokens was made huge
    s = ServerUnderTest(smollm2_path, "--device", "cpu-fast", "--max-running", "8", "--max-model-len", "128",
                        timeout=180)
    yield s
    s.close()
