"""A bounded load run over HTTP against a real `zinfer serve`: 64 concurrent streaming
clients, short requests, 10% of them leaving mid-stream. Every request must end in
exactly one terminal, /metrics must count what the clients saw, and no KV block may
stay held once the server is idle. ZINFER_HTTP_LOAD_REQUESTS scales it (default 128: about 2
minutes on 2 shared cores)."""

from __future__ import annotations

import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from http_server import running_server, sse_events

pytestmark = pytest.mark.slow

CLIENTS = 64
REQUESTS = int(os.environ.get("ZINFER_HTTP_LOAD_REQUESTS", "128"))
WORDS = ["sea", "tree", "cloud", "stone", "river", "bird", "light", "road"]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(smollm2_path, "--max-running", "32") as s:
        yield s


def one_request(http: httpx.Client, model: str, i: int) -> str:
    """Stream one completion; returns "finished", "left" (we disconnected) or an error text."""
    rng = random.Random(i)
    leave = i % 10 == 0
    body = {
        "model": model,
        "prompt": f"A short line about the {rng.choice(WORDS)}:",
        "max_tokens": 64 if leave else rng.randint(4, 8),
        "ignore_eos": leave,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
    }
    with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return f"status {r.status_code}: {r.read()[:200]!r}"
        events = sse_events(r.iter_lines())
        reasons, done = [], 0
        for n, data in enumerate(events):
            if leave and n == 1:
                return "left"  # closes the connection mid-stream
            if data == "[DONE]":
                done += 1
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                return f"error event: {chunk['error']}"
            reasons += [c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]]
    if done != 1 or len(reasons) != 1 or reasons[0] not in ("stop", "length"):
        return f"bad ending: {done} [DONE], finish reasons {reasons}"
    return "finished"


def test_load_streams_end_once_metrics_agree_and_no_kv_leaks(server):
    before = server.wait_idle()
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    with httpx.Client(base_url=server.url, timeout=300, limits=limits) as http, ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(lambda i: one_request(http, server.model, i), range(REQUESTS)))
    elapsed = time.monotonic() - t0
    errors = [r for r in results if r not in ("finished", "left")]
    assert not errors, errors[:5]
    after = server.wait_idle(timeout=60)

    def delta(outcome: str) -> float:
        key = f'zinfer_requests_total{{outcome="{outcome}"}}'
        return after[key] - before[key]

    assert delta("finished") == results.count("finished")
    assert delta("cancelled") == results.count("left") == REQUESTS // 10 + (REQUESTS % 10 > 0)
    assert delta("rejected") == delta("failed") == 0
    assert after["zinfer_kv_used_blocks"] == 0 and after["zinfer_engine_open_requests"] == 0
    assert after["zinfer_requests_in_flight"] == 0
    n_ttft = after["zinfer_time_to_first_token_seconds_count"] - before["zinfer_time_to_first_token_seconds_count"]
    assert n_ttft == REQUESTS  # every request, the leavers too, got a first token
    print(f"\n{REQUESTS} streams, {CLIENTS} clients: {elapsed:.1f} s, {REQUESTS / elapsed:.1f} req/s, "
          f"{(after['zinfer_generation_tokens_total'] - before['zinfer_generation_tokens_total']) / elapsed:.1f} "
          "generated tok/s")
