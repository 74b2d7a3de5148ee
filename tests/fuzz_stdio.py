"""The fuzz suite's side of `zinfer stdio`: a subprocess fed request lines, and the per-case check.

Like fuzz_surfaces.py for the other ways in: `stdio_case` writes one case's lines and
raises AssertionError naming the input when a line gets no terminal event or more than
one, or an event follows a request's terminal; `StdioUnderTest` restarts a process that
an example killed, and drops events left over from an earlier failed case.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from fuzz_surfaces import ENGINE_TERMINALS, GREEDY, REPLY_TIMEOUT, Ledger, engine_expects
from zinfer.messages.client import ClientRequest

_JSON_REQUEST = msgspec.json.Decoder(ClientRequest)


class StdioUnderTest:
    """`zinfer stdio` in a subprocess; a reader thread queues its stdout lines. Restarted if it died."""

    def __init__(self, model: Path | str):
        self.model = model
        self.restarts = self.syncs = 0
        self._start()
        self.reference = self.greedy()

    def _start(self) -> None:
        cmd = [sys.executable, "-m", "zinfer.gateway.cli", "stdio", "--model", str(self.model), "--max-running", "8"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[bytes] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        ready = self.next_event(120)
        assert ready["type"] == "ready", ready

    @staticmethod
    def _read(pipe, put) -> None:
        for line in pipe:
            put(line)
        put(b"")

    def ensure_alive(self) -> None:
        """Restart the process if it died; then drop every event left from earlier cases."""
        if self.proc.poll() is not None:
            self.restarts += 1
            self._start()
        self.drain()

    def drain(self, timeout: float = 60.0) -> None:
        """Read and drop events until the engine reports no open request (a failed case may leave some)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.syncs += 1
            rid = f"@sync{self.syncs}"
            self.write(json.dumps({"type": "stats", "request_id": rid}).encode())
            while (ev := self.next_event(REPLY_TIMEOUT)).get("request_id") != rid:
                pass
            if not ev.get("open_requests") and not ev.get("running"):
                return
            time.sleep(0.1)

    def run_case(self, check, *args, case: object) -> None:
        """check(*args), naming the case and stderr's tail when the process died during it."""
        try:
            check(*args)
        except Exception as exc:
            if self.proc.poll() is not None:
                raise AssertionError(f"zinfer stdio exited with {self.proc.returncode} on this case:\n"
                                     f"case: {case!r}\nstderr:\n{self.stderr_tail()}") from exc
            raise

    def stderr_tail(self) -> str:
        return b"".join(self.stderr)[-3000:].decode(errors="replace")

    def write(self, line: bytes) -> None:
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def next_event(self, timeout: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        if not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)  # stdout closes as the process exits: let run_case see the exit
            raise AssertionError(f"stdout closed (exit {self.proc.poll()}); stderr:\n{self.stderr_tail()}")
        return json.loads(line)

    def request(self, obj: dict) -> list[dict]:
        """Every event of one well-formed request, up to its terminal."""
        self.write(json.dumps(obj).encode())
        events = []
        while not events or events[-1]["type"] not in ENGINE_TERMINALS:
            events.append(self.next_event(REPLY_TIMEOUT))
        return events

    def greedy(self) -> str:
        params = {"temperature": 0, "max_tokens": GREEDY["max_tokens"]}
        events = self.request({"type": "generate", "request_id": "@greedy", "prompt": GREEDY["prompt"],
                               "params": params})
        assert events[-1]["type"] == "finished", events
        return "".join(e.get("text", "") for e in events if e["type"] == "delta")

    def check_healthy(self, case: object) -> None:
        """The process lives, the engine is idle with no KV block held, and answers as before."""
        assert self.proc.poll() is None, (f"zinfer stdio exited with {self.proc.returncode} on this case:\n"
                                          f"case: {case!r}\nstderr:\n{self.stderr_tail()}")
        deadline = time.monotonic() + 30
        while True:
            stats = self.request({"type": "stats", "request_id": "@stats"})[-1]
            held = {k: stats.get(k, 0) for k in ("running", "waiting", "kv_used_blocks", "open_requests")}
            if not any(held.values()):
                break
            assert time.monotonic() < deadline, f"not idle after the case: {held}\ncase: {case!r}"
            time.sleep(0.1)
        assert self.greedy() == self.reference, f"greedy text changed after the case\ncase: {case!r}"

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stdio_case(z: StdioUnderTest, lines: list[bytes], case: list) -> None:
    """Write a burst of lines; every line but a well-formed cancel gets exactly one terminal event."""
    ledger = Ledger(case)
    for line, request in zip(lines, case):
        ledger.request(*engine_expects(request, lambda: _JSON_REQUEST.decode(line)))
        z.write(line)
    deadline = time.monotonic() + REPLY_TIMEOUT
    barrier = False
    while True:
        if ledger.done() and not barrier:
            z.write(b'{"type": "stats", "request_id": "@barrier"}')  # answered after anything still queued
            barrier = True
        try:
            ev = z.next_event(max(deadline - time.monotonic(), 0.01))
        except TimeoutError:
            raise AssertionError(ledger.missing()) from None
        if ev.get("request_id") == "@barrier":
            return
        ledger.event(ev.get("request_id"), ev.get("type") in ENGINE_TERMINALS, ev)
