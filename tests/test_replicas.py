"""`zinfer serve --replicas 2` on a local Ray cluster of three raylets (a head without CPUs
and two one-CPU nodes), SmolLM2 with one thread per replica: streamed greedy completions at
concurrency 32 while replica processes are killed. Every request completes, a moved
stream's text is the fault-free text, and afterwards /metrics shows nothing in flight and
no KV block in use on any replica. The issue's full run (1,000 requests, 10 kills) is
tests/benchmarks/bench_replicas.py."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("ray")

from replica_chaos import chaos, ray_cluster, replicated_server  # noqa: E402

pytestmark = pytest.mark.slow


async def test_requests_survive_killed_replicas_with_the_fault_free_text(tmp_path):
    with ray_cluster(nodes=2) as address, \
            replicated_server(address, "smollm2-135m", 2, tmp_path / "serve.log") as url:
        result = await chaos(url, n=120, concurrency=32, kills=3, replicas=2, max_tokens=8)
    log = (tmp_path / "serve.log").read_text()
    assert result.kills == 3
    assert not result.errors, result.errors[:3]
    assert result.finished == 120
    assert not result.mismatched, result.mismatched[:3]
    assert re.search(r"request moved .*tokens_sent=[1-9]", log), "no stream was continued after tokens"
    m = result.metrics_after
    assert m["zinfer_requests_in_flight"] == 0
    replicas = [k for k in m if k.startswith("zinfer_replica_up{")]
    assert len(replicas) == 2 and all(m[k] == 1 for k in replicas)
    for k, v in m.items():
        if k.startswith(("zinfer_replica_kv_used_blocks{", "zinfer_replica_open_requests{")):
            assert v == 0, (k, v)
