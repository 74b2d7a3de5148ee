"""`zinfer serve --replicas 2` and `zinfer stdio --replicas 2` on a local Ray cluster of three
raylets (a head without CPUs and two one-CPU nodes), SmolLM2 with one thread per replica.

Serve: streamed greedy chat completions at concurrency 32 while replica processes are killed;
every request completes, a moved stream's text is the fault-free text, and afterwards
/metrics shows nothing in flight and no KV block in use on any replica. The issue's full run
(1,000 requests, 10 kills) is tests/benchmarks/bench_replicas.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("ray")

from replica_chaos import PROMPTS, chaos, ray_cluster, replicated_server, replicated_server_process  # noqa: E402

pytestmark = pytest.mark.slow

COUNT_SCHEMA = {"type": "object", "properties": {"count": {"type": "integer"}, "word": {"type": "string"}},
                "required": ["count", "word"], "additionalProperties": False}


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(nodes=2) as address:
        yield address


async def test_requests_survive_killed_replicas_with_the_fault_free_text(cluster, tmp_path):
    # cpu-fast's int8 kernels as served: every int8 path applies the scales in one float order
    # (tests/int8_canonical.py), so a greedy text does not depend on the batch or prefix-cache hits
    # and a moved stream's text can be held to the fault-free one
    with replicated_server(cluster, "smollm2-135m", 2, tmp_path / "serve.log") as url:
        # up to 40 tokens a stream: on a quiet host SmolLM2's 12-token streams ended before a kill found
        # one under way (no stream was continued after tokens in a clean-clone CI run)
        result = await chaos(url, n=80, concurrency=32, kills=3, replicas=2, max_tokens=40, prompts=PROMPTS[:24])
        mark = len((tmp_path / "serve.log").read_text())
        # two choices under a JSON schema: a moved one splits, each choice continues with its grammar's state
        # (32 requests of up to 40 tokens: the kill finds two-choice streams under way on a quiet host too)
        shaped = await chaos(url, n=32, concurrency=16, kills=1, replicas=2, max_tokens=40, prompts=PROMPTS[:8],
                             seed=1, extra={"n": 2, "response_format": {"type": "json_schema", "json_schema": {
                                 "name": "count", "schema": COUNT_SCHEMA}}})
    log = (tmp_path / "serve.log").read_text()
    assert shaped.kills == 1 and not shaped.errors and not shaped.mismatched, (shaped.errors + shaped.mismatched)[:3]
    assert shaped.finished == 32
    assert "request split" in log[mark:], "no two-choice stream was split"
    log = log[:mark]
    assert result.kills == 3
    assert not result.errors, result.errors[:3]
    assert result.finished == 80
    assert not result.mismatched, result.mismatched[:3]
    m = result.metrics_after
    assert all(m[f'zinfer_replica_requests_total{{replica="replica-{i}"}}'] > 0 for i in (0, 1)), m
    assert re.search(r"request moved .*tokens_sent=[1-9]", log), "no stream was continued after tokens"
    assert m["zinfer_requests_in_flight"] == 0
    replicas = [k for k in m if k.startswith("zinfer_replica_up{")]
    assert len(replicas) == 2 and all(m[k] == 1 for k in replicas)
    for k, v in m.items():
        if k.startswith(("zinfer_replica_kv_used_blocks{", "zinfer_replica_open_requests{")):
            assert v == 0, (k, v)


def test_sigusr1_scales_down_by_one_replica_and_its_requests_finish(cluster, tmp_path):
    """Each SIGUSR1 drains one replica for good: its running streams finish, later requests go to
    the others, /metrics shows it down, and the last replica is kept."""
    log = tmp_path / "serve.log"
    with replicated_server_process(cluster, "smollm2-135m", 2, log) as (url, proc):
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]

        def complete(i: int) -> httpx.Response:
            body = {"model": model, "prompt": f"Count to {i}:", "max_tokens": 24, "temperature": 0}
            return httpx.post(url + "/v1/completions", json=body, timeout=120)

        with ThreadPoolExecutor(8) as pool:
            running = [pool.submit(complete, i) for i in range(8)]
            time.sleep(1.0)  # the streams are under way on both replicas
            proc.send_signal(signal.SIGUSR1)
            assert all(f.result().status_code == 200 for f in running)
        deadline = time.monotonic() + 60
        while "scaled down" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(complete(i).status_code == 200 for i in range(4))
        proc.send_signal(signal.SIGUSR1)  # one replica left: refused
        time.sleep(1.0)
        metrics = httpx.get(url + "/metrics").text
    up = dict(re.findall(r'zinfer_replica_up\{replica="([^"]+)"\} (\S+)', metrics))
    assert sorted(float(v) for v in up.values()) == [0.0, 1.0], up
    text = log.read_text()
    assert "scaled down" in text and "scale-down refused: one replica left" in text


def test_stdio_relays_through_the_router_and_exits_at_eof(cluster):
    lines = [{"type": "generate", "request_id": f"r{i}", "prompt": f"Count to {i}:",
              "params": {"temperature": 0, "max_tokens": 6}} for i in range(3)]
    lines.append({"type": "stats", "request_id": "s"})
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", "stdio", "--model", "smollm2-135m", "--replicas", "2",
           "--ray-address", cluster, "--threads", "1"]
    done = subprocess.run(cmd, input="".join(json.dumps(x) + "\n" for x in lines), capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(x) for x in done.stdout.splitlines()]
    assert events[0]["type"] == "ready"
    for i in range(3):
        mine = [e for e in events if e.get("request_id") == f"r{i}"]
        assert [e["type"] for e in mine][0] == "started" and mine[-1]["type"] == "finished"
        assert sum(e["type"] in ("finished", "failed", "cancelled", "rejected") for e in mine) == 1
        assert "".join(e.get("text", "") for e in mine if e["type"] == "delta")
    assert [e["type"] for e in events if e.get("request_id") == "s"] == ["stats"]
