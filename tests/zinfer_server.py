"""`zinfer serve` as a subprocess for end-to-end gateway tests (one per test module)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    port: int
    zmq: str  # the public ZeroMQ endpoint
    log_path: str

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


@contextlib.contextmanager
def zinfer_serve(model: str, timeout_s: float = 120.0) -> Iterator[Server]:
    """Start `zinfer serve --model MODEL --port P --zmq tcp://127.0.0.1:Q`; yield once it logs "serving"."""
    port, zport = free_port(), free_port()
    fd, log_path = tempfile.mkstemp(prefix="zinfer-serve-", suffix=".log")
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", "serve", "--model", str(model), "--port", str(port), "--zmq", f"tcp://127.0.0.1:{zport}", "--max-running", "8"]
    proc = subprocess.Popen(cmd, stdout=fd, stderr=fd, stdin=subprocess.DEVNULL)
    os.close(fd)
    server = Server(port, f"tcp://127.0.0.1:{zport}", log_path)
    try:
        deadline = time.monotonic() + timeout_s
        while "serving" not in server.log():
            if proc.poll() is not None:
                raise RuntimeError(f"zinfer serve exited with {proc.returncode}:\n{server.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"zinfer serve not ready after {timeout_s} s:\n{server.log()}")
            time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.unlink(log_path)
