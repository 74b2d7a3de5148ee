"""A real `zinfer serve` in a subprocess for HTTP tests, and small helpers around it.

`running_server(model, ...)` starts the server on a free 127.0.0.1 port with a public
ZeroMQ endpoint too, so a test can compare what HTTP clients get with the engine's own
output for the same request.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    zmq: str  # tcp://127.0.0.1:PORT, the engine's front door
    model: str  # the served model name, as passed to --model
    api_key: str | None
    log: Path
    saw_loading: bool = False  # /health answered 503 {"status": "loading"} before 200
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ws(self) -> str:
        """The websocket chat endpoint."""
        return self.url.replace("http://", "ws://", 1) + "/v1/ws"

    def metrics(self) -> dict[str, float]:
        """GET /metrics parsed into {'name{labels}': value} (comments left out)."""
        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def wait_idle(self, timeout: float = 60.0) -> dict[str, float]:
        """Metrics once no request is open in the gateway or the engine and no KV block is held."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (m["zinfer_requests_in_flight"] == 0 and m["zinfer_engine_open_requests"] == 0
                    and m["zinfer_running_sequences"] == 0 and m["zinfer_queue_depth"] == 0)
            if (idle and m["zinfer_kv_used_blocks"] == 0) or time.monotonic() > deadline:
                return m
            time.sleep(0.2)

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]


@contextlib.contextmanager
def running_server(model: Path | str, *args: str, api_key: str | None = None, max_waiting: int | None = None,
                   timeout: float = 180.0) -> Iterator[Server]:
    """Start `zinfer serve --model MODEL ARGS...`, wait for /health 200, stop it on exit."""
    port, zmq_port = free_port(), free_port()
    serve_args = ["serve", "--model", str(model), "--port", str(port), "--zmq", f"tcp://127.0.0.1:{zmq_port}", *args]
    if "--device" not in args:
        serve_args += ["--device", "cpu"]  # the HTTP tests' texts and numbers are the oracle's
    if api_key:
        serve_args += ["--api-key", api_key]
    if max_waiting is not None:
        serve_args += ["--max-waiting", str(max_waiting)]
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", *serve_args]
    fd, log_name = tempfile.mkstemp(prefix="zinfer-serve-", suffix=".log")
    os.close(fd)
    log = Path(log_name)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    server = Server(f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{zmq_port}", str(model), api_key, log,
                    headers=headers)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(server, proc, timeout)
        yield server
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)  # a test that needs the log reads it inside the with block


def _wait_ready(server: Server, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"zinfer serve exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            r = httpx.get(server.url + "/health", timeout=5)
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        if r.status_code == 200:
            return
        if r.status_code == 503 and r.json() == {"status": "loading"}:
            server.saw_loading = True
        time.sleep(0.1)
    raise RuntimeError(f"zinfer serve not ready within {timeout} s:\n{server.log_tail()}")


def sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The data payloads of an SSE stream's events, in order."""
    for line in lines:
        m = re.match(r"data: ?(.*)", line)
        if m:
            yield m.group(1)

