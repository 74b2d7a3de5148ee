"""`zinfer stdio`: JSON lines in and out of a real subprocess, from a Node.js host and from Python."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NODE = shutil.which("node")
STDIO_CLIENT = Path(__file__).parent / "node" / "stdio_client.mjs"


def zinfer_stdio(model) -> list[str]:
    return [sys.executable, "-m", "zinfer.gateway.cli", "stdio", "--model", str(model), "--device", "cpu",
            "--max-running", "8"]


@pytest.mark.slow
@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_node_host_streams_and_cancels(smollm2_path):
    r = subprocess.run([NODE, str(STDIO_CLIENT), "What is the capital of France?", *zinfer_stdio(smollm2_path)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.splitlines()[-1])["summary"]
    assert summary["ready"]["max_model_len"] > 0
    assert summary["g"][0] == "started" and summary["g"][-1] == "finished" and "delta" in summary["g"]
    assert "Paris" in summary["text"]
    c = summary["c"]
    assert c[0] == "started" and "delta" in c and c[-1] == "cancelled" and c.count("cancelled") == 1
    assert not {"finished", "rejected", "failed"} & set(c)
    assert summary["exit"] == 0


class Stdio:
    """zinfer stdio with pipes: write request lines, read event lines."""

    def __init__(self, model):
        self.proc = subprocess.Popen(zinfer_stdio(model), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def write(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"stdout closed; stderr:\n{self.proc.stderr.read()[-2000:]}"
        return json.loads(line)


@pytest.mark.slow
def test_bad_lines_get_rejected_and_eof_lets_open_requests_finish(smollm2_path):
    z = Stdio(smollm2_path)
    try:
        assert z.read()["type"] == "ready"
        bad = [
            ("this is not json", "", "malformed"),
            ('{"type": "explode", "request_id": "e1"}', "e1", "explode"),
            ('{"type": "generate", "request_id": "e2", "prompt": "x", "params": {"max_tokens": "many"}}',
             "e2", "max_tokens"),
            ('{"type": "generate", "prompt": "no id"}', "", "request_id"),
            ('["generate", "e3"]', "", "object"),
        ]
        for line, rid, words in bad:
            z.write(line)
            ev = z.read()
            assert ev["type"] == "rejected" and ev["code"] == "bad_request" and ev["request_id"] == rid, (line, ev)
            assert words in ev["message"], (line, ev)
        z.write("")  # blank lines are skipped
        # parameters the engine refuses: rejected by the engine, same shape
        z.write('{"type": "generate", "request_id": "e4", "prompt": "x", "params": {"temperature": -1}}')
        ev = z.read()
        assert ((ev["type"], ev["request_id"], ev["code"]) == ("rejected", "e4", "bad_request")
                and "temperature" in ev["message"])

        # still alive: a generation, then EOF while it runs; it finishes, then the process exits 0
        z.write('{"type": "generate", "request_id": "ok", "prompt": "The capital of France is", '
                '"params": {"temperature": 0, "max_tokens": 12, "ignore_eos": true}}')
        z.write('{"type": "generate", "request_id": "ok", "prompt": "again"}')  # its id is in use
        z.proc.stdin.close()
        rest = [json.loads(line) for line in z.proc.stdout]
        assert z.proc.wait(60) == 0
        stderr = z.proc.stderr.read()
    finally:
        if z.proc.poll() is None:
            z.proc.kill()
            z.proc.wait()
    in_use = [e for e in rest if e["type"] == "rejected"]
    assert len(in_use) == 1 and "'ok' is already in use" in in_use[0]["message"]
    ok = [e for e in rest if e["type"] != "rejected"]
    assert all(e["request_id"] == "ok" for e in ok)
    assert [e["type"] for e in ok] == ["started"] + ["delta"] * (len(ok) - 2) + ["finished"]
    assert ok[-1]["usage"]["completion_tokens"] == 12
    assert "Paris" in "".join(e.get("text", "") for e in ok if e["type"] == "delta")
    assert "bad request line" in stderr  # logs go to stderr, never stdout


# ---- on a tiny random model: framing, a host that goes away, other topologies ------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tiny import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama", max_position_embeddings=32768)


def _generate_line(rid: str, max_tokens: int = 4) -> str:
    return json.dumps({"type": "generate", "request_id": rid, "prompt": "hello world",
                       "params": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}})


def test_an_overlong_line_is_rejected_and_the_next_lines_stay_whole(tiny_model):
    from zinfer.gateway.stdio import MAX_LINE

    overlong = '{"type": "generate", "request_id": "huge", "prompt": "' + "x" * (MAX_LINE + 100) + '"}'
    proc = subprocess.Popen(zinfer_stdio(tiny_model), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate("\n".join([overlong, _generate_line("g1"), _generate_line("g2")]).encode() + b"\n",
                                    timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    events = [json.loads(line) for line in out.splitlines()][1:]  # after "ready"
    rejected = [e for e in events if e["type"] == "rejected"]
    assert len(rejected) == 1 and f"longer than {MAX_LINE} bytes" in rejected[0]["message"], rejected
    for rid in ("g1", "g2"):
        mine = [e["type"] for e in events if e["request_id"] == rid]
        assert mine[0] == "started" and mine[-1] == "finished", (rid, mine)


def test_a_host_that_closes_our_stdout_ends_us_quietly(tiny_model):
    proc = subprocess.Popen(zinfer_stdio(tiny_model), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline())["type"] == "ready"
        proc.stdin.write(_generate_line("long", max_tokens=30000) + "\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["type"] == "started"
        proc.stdout.close()  # stdin stays open: the host is gone all the same
        assert proc.wait(60) == 0
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and "stdout closed by the host" in err, err[-2000:]


@pytest.mark.slow  # an actor per process: ~5 s
def test_stdio_on_the_tcp_topology(tiny_model):
    proc = subprocess.Popen([*zinfer_stdio(tiny_model), "--topology", "tcp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(_generate_line("t").encode() + b"\n", timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["type"] == "ready" and events[0]["max_model_len"] == 32768  # the model's own context
    types = [e["type"] for e in events[1:]]
    assert types[0] == "started" and types[-1] == "finished" and set(types[1:-1]) == {"delta"}, types
    assert events[-1]["usage"]["completion_tokens"] == 4


def test_an_integer_past_64_bits_is_named_an_integer(tiny_model):
    """Before, add_special: 2**70 was refused as "Expected `bool`, got `float`": msgspec reads such a literal
    as a float."""
    lines = ['{"type": "tokenize", "request_id": "t", "text": "hi", "add_special": %d}' % 2**70,
             '{"type": "generate", "request_id": "g", "messages": [{"role": "user", "content": %d}]}' % -(2**70)]
    proc = subprocess.Popen(zinfer_stdio(tiny_model), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate("\n".join(lines).encode() + b"\n", timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = [json.loads(line) for line in out.splitlines()][1:]  # after "ready"
    assert [(e["type"], e["request_id"]) for e in events] == [("rejected", "t"), ("rejected", "g")], events
    assert "Expected `bool`, got `int` - at `$.add_special`" in events[0]["message"], events[0]
    assert "got `int` - at `$.messages[0].content`" in events[1]["message"], events[1]
