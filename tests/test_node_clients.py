"""A Node.js client (zeromq v6 + @msgpack/msgpack) speaks the public ZeroMQ protocol of `zinfer serve --zmq`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio
import zmq

from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta
from zinfer.messages.params import SamplingParams
from http_server import running_server

NODE_DIR = Path(__file__).parent / "node"
NODE = shutil.which("node")
pytestmark = [
    pytest.mark.slow,  # a real model behind the Node.js clients
    pytest.mark.skipif(NODE is None, reason="node is not installed"),
    pytest.mark.skipif(not (NODE_DIR / "node_modules" / "zeromq").exists(), reason="run `npm ci` in tests/node first"),
]

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(smollm2_path, "--max-running", "8") as s:
        yield s


async def python_text(endpoint: str, max_tokens: int) -> str:
    """The same greedy request through the Python AsyncClient."""
    ctx = zmq.Context()
    try:
        async with AsyncClient(ctx, endpoint) as client:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            return "".join([ev.text async for ev in client.generate(messages=[{"role": "user", "content": PROMPT}],
                                                                    params=params) if isinstance(ev, Delta)])
    finally:
        ctx.destroy(linger=0)


async def test_node_zmq_client_streams_and_cancels(server):
    with trio.fail_after(180):
        result = await trio.run_process([NODE, str(NODE_DIR / "zmq_client.mjs"), server.zmq, PROMPT, "24"],
                                        capture_stdout=True, capture_stderr=True, check=False)
        assert result.returncode == 0, result.stderr.decode()
        lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
        summary = lines[-1]["summary"]
        events = lines[:-1]

        first = [e for e in events if e.get("request_id") == "node-1"]
        assert [e["type"] for e in first][0] == "started" and first[-1]["type"] == "finished"
        assert summary["text"] and summary["text"] == await python_text(server.zmq, 24)
        assert first[-1]["usage"]["completion_tokens"] == sum(len(e.get("token_ids", [])) for e in first
                                                              if e["type"] == "delta")

        second = summary["second"]
        assert second[0] == "started" and "delta" in second
        assert second.count("cancelled") == 1 and second[-1] == "cancelled"
        assert not {"finished", "rejected", "failed"} & set(second)
        assert summary["open_requests"] == 0
