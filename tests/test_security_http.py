"""What a web page on another site can make a local `zinfer serve` do, and the API key's
browser path, against a real server (a tiny random llama in the fast tier, SmolLM2 in
the slow) with httpx and a real websocket client.

A browser sends `Origin` on every websocket handshake and cross-origin POST, and after
DNS rebinding it sends the attacker's name as `Host`: these tests send what such a
browser sends and check the server refuses it before any generation runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from http_server import running_server
from tiny import write_tiny_gguf

KEY = "sk-local-test"
APP = "http://app.example"
HI = [{"role": "user", "content": "Hi"}]
CHAT = {"messages": HI, "max_tokens": 1, "temperature": 0}


MODELS = ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)]  # tiny: the fast tier


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama")


@pytest.fixture(scope="module", params=MODELS)
def model_path(request):
    return request.getfixturevalue(f"{request.param}_path")


@pytest.fixture(scope="module")
def server(model_path):
    """No API key (the case a hostile page can exploit), one extra allowed origin."""
    with running_server(model_path, "--max-running", "4", "--allowed-origins", APP) as s:
        yield s


@pytest.fixture(scope="module")
def keyed(model_path):
    with running_server(model_path, "--max-running", "4", api_key=KEY) as s:
        yield s


def port(server) -> str:
    return server.url.rsplit(":", 1)[1]


def generations(server) -> tuple[float, float]:
    """(requests the gateway counted, prompt tokens admitted): both move when a generation runs."""
    m = server.metrics()
    return sum(v for k, v in m.items() if k.startswith("zinfer_requests_total")), m["zinfer_prompt_tokens_total"]


def refused_status(url: str, **kw) -> int:
    """The HTTP status a websocket handshake was refused with (fails if it was accepted)."""
    with pytest.raises(InvalidStatus) as info:
        with connect(url, **kw):
            pass
    return info.value.response.status_code


def ping(url: str, **kw) -> dict:
    with connect(url, **kw) as ws:
        ws.send('{"type": "ping"}')
        return json.loads(ws.recv(timeout=60))


# ---- Origin on the websocket ------------------------------------------------------------


def test_websocket_from_another_site_is_refused_before_accept(server):
    assert refused_status(server.ws, origin="http://evil.example") == 403
    assert refused_status(server.ws, origin="null") == 403  # sandboxed frames, file:// pages
    assert refused_status(server.ws, origin=f"http://127.0.0.1.evil.example:{port(server)}") == 403


def test_websocket_from_the_page_loopback_and_allowed_origins_is_served(server):
    for origin in (f"http://127.0.0.1:{port(server)}", f"http://localhost:{port(server)}", "http://localhost:3000",
                   APP):
        assert ping(server.ws, origin=origin) == {"type": "pong"}, origin
    assert ping(server.ws) == {"type": "pong"}  # no Origin: not a browser


# ---- Host (DNS rebinding) ---------------------------------------------------------------


def test_foreign_host_header_is_refused_and_runs_nothing(server):
    before = generations(server)
    r = httpx.get(server.url + "/v1/models", headers={"Host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    r = httpx.post(server.url + "/v1/chat/completions", headers={"Host": f"evil.example:{port(server)}"}, json=CHAT)
    assert r.status_code == 403 and set(r.json()["error"]) >= {"message", "type", "param", "code"}
    handshake = {"Host": "evil.example", "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    assert httpx.get(server.url + "/v1/ws", headers=handshake).status_code == 403
    assert generations(server) == before
    for host in (f"127.0.0.1:{port(server)}", f"localhost:{port(server)}", f"[::1]:{port(server)}"):
        assert httpx.get(server.url + "/v1/models", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_flag_and_non_loopback_bind():
    from zinfer.gateway.origins import OriginPolicy

    assert OriginPolicy.from_args("0.0.0.0", None, None).host_allowed("evil.example")  # exposed anyway: no check
    policy = OriginPolicy.from_args("0.0.0.0", None, "box.lan")
    assert (policy.host_allowed("box.lan:8080") and policy.host_allowed("localhost:8080")
            and not policy.host_allowed("evil.example"))
    assert OriginPolicy.from_args("127.0.0.1", None, "box.lan").host_allowed("BOX.lan")


@pytest.mark.slow
def test_a_bad_allowed_origin_is_one_line_error(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "zinfer.gateway.cli", "serve", "--model", str(smollm2_path),
                        "--port", "1", "--allowed-origins", "app.example"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().startswith(
        "zinfer: error: --allowed-origins: 'app.example'"), r.stderr
    assert "Traceback" not in r.stderr


# ---- simple cross-origin POSTs and CORS -------------------------------------------------


def test_text_plain_post_gets_415_and_runs_nothing(server):
    before = generations(server)
    body = json.dumps(CHAT).encode()
    for kind in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x"):
        r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"Content-Type": kind})
        assert r.status_code == 415, (kind, r.text)
        assert (r.json()["error"]["code"] == "unsupported_media_type"
                and "application/json" in r.json()["error"]["message"])
    assert generations(server) == before
    # the same body as JSON runs, with or without a charset; and the openai package's requests pass
    for kind in ("application/json", "application/json; charset=utf-8"):
        r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"Content-Type": kind}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        assert client.chat.completions.create(model=server.model, messages=HI,
                                              max_tokens=1).usage.completion_tokens == 1


def test_post_from_another_site_is_refused_and_runs_nothing(server):
    before = generations(server)
    r = httpx.post(server.url + "/v1/chat/completions", headers={"Origin": "http://evil.example"}, json=CHAT)
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in r.headers
    assert generations(server) == before


def test_allowed_origin_gets_cors_headers(server):
    r = httpx.post(server.url + "/v1/chat/completions", headers={"Origin": APP}, json=CHAT, timeout=120)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP and "Origin" in r.headers["vary"]
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://localhost:5173"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_preflight_is_answered_for_allowed_origins_only(server):
    asks = {"Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang"}
    r = httpx.options(server.url + "/v1/chat/completions", headers={"Origin": APP, **asks})
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == APP and "Origin" in r.headers["vary"]
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-stainless-lang"} <= allowed
    r = httpx.options(server.url + "/v1/chat/completions", headers={"Origin": "http://evil.example", **asks})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


# ---- the API key's browser path ---------------------------------------------------------


def test_page_takes_the_key_in_its_query(keyed):
    r = httpx.get(keyed.url + f"/?api_key={KEY}")
    assert r.status_code == 200 and "<title>zinfer chat</title>" in r.text
    for query in ("?api_key=wrong", "", f"?api_key={KEY}x"):
        r = httpx.get(keyed.url + "/" + query)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", query
    for asset in ("/static/chat.js", "/static/chat.css"):  # what the page loads; no secrets in them
        assert httpx.get(keyed.url + asset).status_code == 200
    # elsewhere the key goes in the Authorization header only, never the URL
    assert httpx.get(keyed.url + f"/v1/models?api_key={KEY}").status_code == 401
    assert httpx.get(keyed.url + "/v1/models", headers=keyed.headers).status_code == 200


def test_websocket_takes_the_key_in_its_query_end_to_end(keyed):
    origin = f"http://127.0.0.1:{port(keyed)}"  # as the page opened from this server sends it
    with connect(keyed.ws + f"?api_key={KEY}", origin=origin) as ws:
        ws.send(json.dumps({"type": "generate", "id": "g1", "messages": HI,
                            "params": {"temperature": 0, "max_tokens": 4}}))
        got = []
        while not got or got[-1]["type"] not in ("done", "cancelled", "error"):
            got.append(json.loads(ws.recv(timeout=120)))
    kinds = [m["type"] for m in got]
    assert kinds[0] == "started" and kinds[-1] == "done" and "delta" in kinds, got
    assert refused_status(keyed.ws + "?api_key=wrong", origin=origin) == 401
    assert refused_status(keyed.ws, origin=origin) == 401
    assert ping(keyed.ws, additional_headers=keyed.headers) == {"type": "pong"}  # non-browser clients: the header


def test_preflight_needs_no_key_and_the_header_still_works(keyed):
    asks = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization"}
    # browsers send no key here
    assert httpx.options(keyed.url + "/v1/chat/completions", headers=asks).status_code == 204
    with openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as good:
        assert good.chat.completions.create(model=keyed.model, messages=HI, max_tokens=1).usage.completion_tokens == 1
    with openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
