"""The same actors in other topologies: a process per actor over ipc:// and tcp://."""

from __future__ import annotations

import time

import pytest
import trio

import json
import subprocess
import sys

import httpx

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.actors.processes import EngineFailure
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Failed, Finished
from zinfer.messages.params import SamplingParams

PROMPTS = ["The capital of France is", "def add(a, b):", "Roses are red,", "The sun rises in the"]
GREEDY = SamplingParams(temperature=0, max_tokens=8)


async def run_one(client: AsyncClient, prompt: str) -> tuple[list[int], object]:
    ids = []
    async for ev in client.generate(prompt, params=GREEDY):
        if isinstance(ev, Delta):
            ids += ev.token_ids
    return ids, ev


@pytest.mark.slow
async def test_process_topology_matches_in_process(smollm2_path):
    async with (open_engine(EngineConfig(model=str(smollm2_path), device="cpu")) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        single = {p: (await run_one(client, p))[0] for p in PROMPTS}
    results = {}
    async with (open_engine(EngineConfig(model=str(smollm2_path), device="cpu", topology="ipc")) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        assert all(p.returncode is None for p in engine.actors["processes"].values())

        async def one(i: int) -> None:
            ids, last = await run_one(client, PROMPTS[i % 4])
            assert isinstance(last, Finished)
            results[i] = ids

        async with trio.open_nursery() as n:
            for i in range(32):
                n.start_soon(one, i)
    differ = [i for i in range(32) if results[i] != single[PROMPTS[i % 4]]]
    assert not differ, f"outputs {differ} differ from the in-process single-request output"


@pytest.mark.slow
async def test_tcp_topology_generates(smollm2_path):
    async with (open_engine(EngineConfig(model=str(smollm2_path), topology="tcp")) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        assert engine.addrs.executor.startswith("tcp://127.0.0.1:")
        ids, last = await run_one(client, PROMPTS[0])
        assert isinstance(last, Finished) and len(ids) == 8


@pytest.mark.slow
async def test_killing_the_executor_fails_open_requests_fast(smollm2_path):
    failed_after: list[float] = []
    late: list = []
    started = trio.Event()
    with pytest.raises(BaseExceptionGroup) as info:
        async with (open_engine(EngineConfig(model=str(smollm2_path), topology="ipc")) as engine,
                    AsyncClient(engine.ctx, engine.addrs.frontend) as client):
            killed_at = [0.0]

            async def stream(i: int) -> None:
                # ignore_eos: a stream that samples EOS first would finish before the kill
                async for ev in client.generate(f"Tell me a long story number {i}.",
                                                params=SamplingParams(max_tokens=500, ignore_eos=True)):
                    if isinstance(ev, Delta):
                        started.set()
                    if isinstance(ev, Failed):
                        failed_after.append(time.monotonic() - killed_at[0])

            async with trio.open_nursery() as n:
                for i in range(4):
                    n.start_soon(stream, i)
                await started.wait()
                killed_at[0] = time.monotonic()
                engine.actors["processes"]["executor"].kill()
            # a request sent once the failure is known: failed at once, never started
            late += [ev async for ev in client.generate("Too late?", params=GREEDY)]
    assert info.group_contains(EngineFailure, match="executor")
    assert len(failed_after) == 4 and max(failed_after) < 1.0, failed_after
    assert [type(ev) for ev in late] == [Failed] and "executor failed" in late[0].message, late


# ---- the commands on every topology (a tiny random model: start-up is what is tested) ----

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tiny import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama")


def test_serve_on_ipc_answers_a_chat_completion(tiny_model):
    from http_server import running_server

    with running_server(tiny_model, "--topology", "ipc") as server:
        body = {"model": server.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "temperature": 0}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"] == 256


# an actor per process, twice: ~6 s each (test_serve_on_ipc_answers_a_chat_completion keeps one in the fast tier)
@pytest.mark.slow
@pytest.mark.parametrize("topology", ["ipc", "tcp"])
def test_run_on_process_topologies(tiny_model, topology):
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", "run", "--model", str(tiny_model), "--topology", topology,
           "--raw", "--json", "--temperature", "0", "--max-tokens", "4", "hello world"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads(r.stdout.splitlines()[-1])["token_ids"]) == 4
