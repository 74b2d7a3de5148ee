"""How `zinfer serve` ends when an actor dies: a non-zero exit and one clear line naming the
actor and the error, not a trio ExceptionGroup traceback of dozens of lines on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from http_server import Server, _wait_ready, free_port
from tiny import write_tiny_gguf


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is pid."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out.append((int(entry.name), cmdline))
    return out


def test_a_dead_actor_process_ends_serve_with_one_line_naming_it(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", max_position_embeddings=256)
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "zinfer.gateway.cli", "serve", "--model", str(model), "--port", str(port),
           "--device", "cpu", "--topology", "ipc"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(Server(f"http://127.0.0.1:{port}", "", str(model), None, log), proc, 180)
        (executor,) = [pid for pid, line in children(proc.pid) if "zinfer.actors.processes executor" in line]
        os.kill(executor, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.returncode not in (None, 0), log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and "ExceptionGroup" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert "executor" in last and "exited with code -9" in last, text[-3000:]
