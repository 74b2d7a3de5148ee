"""Replicas under fire: a `zinfer serve --replicas N` subprocess joined to a local Ray cluster
(ray.cluster_utils.Cluster, several raylets on this machine), streamed chat completions at a
fixed concurrency while replica processes are killed (SIGKILL) at random moments.

Used by tests/test_replicas.py (a lean run) and tests/benchmarks/bench_replicas.py (the
issue's 1,000 requests and 10 kills). Every request's streamed text is compared with what
the same server streamed for the same prompt before any fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import trio

from http_server import free_port

PROMPTS = [f"Write one sentence about the number {i} and the colour {c}."
           for i, c in zip(range(48), ["red", "green", "blue", "amber", "violet", "grey"] * 8)]


@dataclass
class ChaosResult:
    requests: int = 0
    finished: int = 0
    errors: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, str, str]] = field(default_factory=list)  # prompt, expected, got
    kills: int = 0
    midstream: int = 0  # requests now open that have streamed text
    seconds: float = 0.0
    metrics_after: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def ray_cluster(nodes: int, cpus_per_node: int = 1) -> Iterator[str]:
    """A local Ray cluster: a head with no CPUs (so replicas land on the worker nodes) and
    `nodes` worker raylets; yields its address. This process is connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=cpus_per_node)
    ray.init(address=cluster.address, namespace="zinfer-tests", log_to_driver=False)
    try:
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextlib.contextmanager
def replicated_server(address: str, model: str, replicas: int, log: Path, *extra: str) -> Iterator[str]:
    """`zinfer serve --replicas N --ray-address address` on a free port; yields its URL once
    /health answers 200; SIGINT (a drain) at exit."""
    with replicated_server_process(address, model, replicas, log, *extra) as (url, _):
        yield url


@contextlib.contextmanager
def replicated_server_process(
    address: str, model: str, replicas: int, log: Path, *extra: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """replicated_server's URL and its process (to signal it)."""
    port = free_port()
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", "serve", "--model", model, "--port", str(port),
           "--replicas", str(replicas), "--ray-address", address, "--threads", "1", "--max-running", "32", *extra]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited {proc.returncode}: {log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        else:
            raise TimeoutError(f"serve not ready: {log.read_text()[-3000:]}")
        yield url, proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def replica_pids() -> dict[str, int]:
    """The pid of every live zinfer replica actor in the cluster, by actor name."""
    import ray

    out = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name, ns = entry["name"], entry["namespace"]
        if re.match(r"zinfer-[0-9a-f]{8}-replica-\d+$", name):
            with contextlib.suppress(Exception):
                info = json.loads(ray.get(ray.get_actor(name, namespace=ns).info.remote(), timeout=5))
                out[name] = info["pid"]
    return out


def read_metrics(url: str) -> dict[str, float]:
    """/metrics as {'name{labels}': value}."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                       if line and not line.startswith("#"))}


async def stream_completion(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
                            result: ChaosResult | None = None, extra: dict[str, Any] | None = None) -> tuple[str, str]:
    """(text, finish_reason) of one streamed greedy chat completion (extra: more body fields;
    with n > 1 the choices' texts in index order, joined by CHOICE_SEP, and the last reason);
    raises on an error event. result.midstream counts it while it is open after its first text."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, **(extra or {})}
    texts: dict[int, list[str]] = {}
    reason, counted = "", False
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"error event: {chunk['error']}")
                for choice in chunk["choices"]:
                    piece = choice.get("delta", {}).get("content") or ""
                    texts.setdefault(choice["index"], []).append(piece)
                    reason = choice.get("finish_reason") or reason
                    if result is not None and piece and not counted and not reason:
                        counted, result.midstream = True, result.midstream + 1
    finally:
        if counted and result is not None:
            result.midstream -= 1
    return CHOICE_SEP.join("".join(texts[i]) for i in sorted(texts)), reason


CHOICE_SEP = "\n--- next choice ---\n"


async def run_load(url: str, prompts: list[str], n: int, concurrency: int, max_tokens: int,
                   result: ChaosResult, expected: dict[str, str] | None,
                   extra: dict[str, Any] | None = None) -> dict[str, str]:
    """n streamed requests over prompts at the given concurrency; texts by prompt."""
    texts: dict[str, str] = {}
    limit = trio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 4)) as client:

        async def one(i: int) -> None:
            prompt = prompts[i % len(prompts)]
            async with limit:
                try:
                    text, _ = await stream_completion(client, url, prompt, max_tokens, result, extra)
                except (RuntimeError, httpx.HTTPError) as exc:
                    result.errors.append(f"{prompt!r}: {exc}")
                    return
            result.finished += 1
            texts[prompt] = text
            if expected is not None and text != expected[prompt]:
                result.mismatched.append((prompt, expected[prompt], text))

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
    result.requests += n
    return texts


async def killer(n: int, kills: int, result: ChaosResult, seed: int) -> None:
    """Kill a random live replica process `kills` times, at random points of the run (after a
    random number of the n requests has finished, between 10% and 90% of them), each while
    streams are under way (up to 5 s waiting for 8 of them), so some are cut mid-stream."""
    rng = random.Random(seed)
    marks = sorted(rng.sample(range(n // 10, max(n // 10 + kills, n * 9 // 10)), kills))
    for mark in marks:
        while result.finished < mark:
            await trio.sleep(0.02)
        with trio.move_on_after(5):
            while result.midstream < 8:
                await trio.sleep(0.005)
        pids = await trio.to_thread.run_sync(replica_pids)
        while not pids:  # every replica is restarting
            await trio.sleep(0.2)
            pids = await trio.to_thread.run_sync(replica_pids)
        os.kill(pids[rng.choice(sorted(pids))], signal.SIGKILL)
        result.kills += 1


async def chaos(url: str, n: int, concurrency: int, kills: int, replicas: int, max_tokens: int,
                prompts: list[str] = PROMPTS, seed: int = 0, extra: dict[str, Any] | None = None) -> ChaosResult:
    """Fault-free texts of every prompt first, then n requests while replicas are killed
    (extra: more fields of every request's body, e.g. n or response_format)."""
    result = ChaosResult()
    expected = await run_load(url, prompts, len(prompts), concurrency, max_tokens, ChaosResult(), None, extra)
    assert all(expected.values()), "a prompt streamed no text: nothing to compare"
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(killer, n, kills, result, seed)
        await run_load(url, prompts, n, concurrency, max_tokens, result, expected, extra)
    result.seconds = time.perf_counter() - t0
    result.metrics_after = await settled_metrics(url, replicas)
    return result


async def settled_metrics(url: str, replicas: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """/metrics once every replica is up and nothing is in flight (or as it is at the timeout)."""
    with trio.move_on_after(timeout_s):
        while True:
            m = await trio.to_thread.run_sync(read_metrics, url)
            up = sum(v for k, v in m.items() if k.startswith("zinfer_replica_up{"))
            busy = sum(v for k, v in m.items() if k.startswith(("zinfer_replica_kv_used_blocks{",
                                                                 "zinfer_replica_open_requests{")))
            if up >= replicas and busy == 0 and m.get("zinfer_requests_in_flight") == 0:
                return m
            await trio.sleep(0.5)
    return await trio.to_thread.run_sync(read_metrics, url)
