"""Tracing the real engine (SmolLM2): the trace of a 3-request run, tracing off, the
multi-process topology in one trace, `zinfer run --trace` + `zinfer trace summarize`,
and the per-request log line."""

from __future__ import annotations

import json
import os

import opentelemetry.sdk.trace as otel_sdk
import pytest
import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.cli import main
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Finished
from zinfer.messages.params import SamplingParams
from zinfer.traces import kernels as trace_kernels
from zinfer.traces.check import check_trace
from zinfer.traces.config import TraceConfig
from zinfer.traces.logs import configure_logging
from zinfer.traces.merge import merge_parts
from zinfer.traces.parts import part_files
from zinfer.traces.summarize import rounds_of

pytestmark = pytest.mark.slow  # every test here loads a real model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Roses are red,"]
GREEDY = SamplingParams(temperature=0, max_tokens=6)


async def run_requests(engine, prompts=PROMPTS, params=GREEDY) -> list[str]:
    """Run the prompts at once; returns their request ids (each must finish)."""
    ids = []
    async with AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        async def one(i: int, prompt: str) -> None:
            rid = f"req-{i}"
            ids.append(rid)
            # the loop keeps the last event
            async for ev in client.generate(prompt, params=params, request_id=rid):  # noqa: B007
                pass
            assert isinstance(ev, Finished)

        async with trio.open_nursery() as n:
            for i, p in enumerate(PROMPTS):
                n.start_soon(one, i, p)
    return ids


def spans(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and "trace_id" in e.get("args", {})]


async def test_a_three_request_trace_accounts_for_every_round(smollm2_path, tmp_path):
    # kernel-time coverage measured on the oracle
    config = EngineConfig(model=str(smollm2_path), device="cpu", trace=TraceConfig(dir=str(tmp_path)))
    async with open_engine(config) as engine:
        n_layers = engine.source.spec.n_layers
        await run_requests(engine)
    doc = merge_parts(part_files(tmp_path))
    assert check_trace(doc) == []
    rounds = rounds_of(doc)
    assert len(rounds) >= GREEDY.max_tokens
    for r in rounds:
        assert r.layers == n_layers, r
        assert {"linear", "attention", "rms_norm", "rope", "glu", "write_kv", "embed"} <= set(r.kernels), r.name
        assert abs(r.kernel_us - r.dur) <= 0.10 * r.dur, (
            f"round {r.args['round_id']}: kernels {r.kernel_us:.0f} µs of {r.dur:.0f} µs")
        assert r.args["batch_size"] >= 1 and r.args["tokens"] >= r.args["batch_size"] and r.args["kv_blocks"] >= 1
    assert rounds[0].name.startswith("prefill") and rounds[-1].name == "decode"
    # every request: its own track with request > tokenize, queue, and each of its rounds
    by_name = {}
    for e in spans(doc):
        by_name.setdefault(e["name"], []).append(e)
    assert sorted(e["args"]["request_id"] for e in by_name["request"]) == ["req-0", "req-1", "req-2"]
    assert len(by_name["tokenize"]) == len(by_name["queue"]) == 3
    mirrors = [e for e in doc["traceEvents"] if e.get("cat") == "request.round"]
    per_request = {}
    for e in mirrors:
        per_request.setdefault(e["tid"], []).append(e["args"]["round_id"])
    assert len(per_request) == 3 and all(len(v) >= GREEDY.max_tokens for v in per_request.values())
    # a round shared by requests links to each: one arrow per request it served
    flows = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    assert len(flows) == len(mirrors) + len(by_name["schedule"])


async def test_with_tracing_off_no_span_and_no_timer_is_built(smollm2_path, monkeypatch, capsys):
    built = []
    for cls in (otel_sdk.Span, trace_kernels.KernelRecorder):
        init = cls.__init__
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _init=init, **k: (built.append(type(self).__name__),
                                                                                _init(self, *a, **k))[1])
    import opentelemetry.trace as otel_api

    monkeypatch.setattr(otel_api.NonRecordingSpan, "__init__", lambda self, *a, **k: built.append("NonRecordingSpan"))
    configure_logging("info", json=True)
    try:
        async with open_engine(EngineConfig(model=str(smollm2_path))) as engine:
            assert engine.actors["executor"].round_tracer is None
            assert engine.actors["executor"].device is not None
            ids = await run_requests(engine)
    finally:
        configure_logging("warning")
    assert built == []
    # the per-request log line: JSON, with the request id, tokens, timing and sampling
    lines = [json.loads(l) for l in capsys.readouterr().err.splitlines() if l.startswith("{")]
    start = next(l for l in lines if l["event"] == "engine started")
    assert (start["arch"] == "llama" and "Q4_1" in start["quant_types"] and start["weights_mib"] > 0
            and start["kv_mib"] > 0)
    done = {l["request_id"]: l for l in lines if l["event"] == "request"}
    assert sorted(done) == sorted(ids)
    for l in done.values():
        assert l["outcome"] == "finished" and l["finish_reason"] == "length"
        assert l["completion_tokens"] == GREEDY.max_tokens and l["prompt_tokens"] > 0 and l["cached_tokens"] >= 0
        assert (l["ttft_ms"] > 0 and l["tokens_per_s"] > 0 and l["temperature"] == 0
                and l["max_tokens"] == GREEDY.max_tokens)


async def test_the_multi_process_topology_traces_into_one_trace(smollm2_path, tmp_path):
    config = EngineConfig(model=str(smollm2_path), topology="ipc", trace=TraceConfig(dir=str(tmp_path)))
    async with open_engine(config) as engine:
        children = {name: p.pid for name, p in engine.actors["processes"].items()}
        await run_requests(engine, PROMPTS[:1])
    doc = merge_parts(part_files(tmp_path))
    assert check_trace(doc) == []
    req = next(e for e in spans(doc) if e["name"] == "request")
    trace = [e for e in spans(doc) if e["args"]["trace_id"] == req["args"]["trace_id"]]
    pids = {e["name"]: e["args"]["pid"] for e in trace}
    assert pids["request"] == pids["tokenize"] == os.getpid()
    assert pids["queue"] == pids["schedule"] == children["scheduler"]
    assert pids["prefill"] == pids["decode"] == children["executor"]
    assert pids["kv_update"] == children["kv"] and pids["sample"] == children["sampler"]
    # kernels of the executor process sit under its rounds, in the same merged file: layer by
    # layer, or (a decode round cpu-fast replayed from a graph, once its replay kernel is
    # ready) as one graph_replay span
    rounds = rounds_of(doc)
    assert all(r.kernel_us > 0 and (r.layers > 0 or "graph_replay" in r.kernels) for r in rounds)
    assert rounds[0].layers > 0  # the prefill round, op by op
    processes = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == ({f"zinfer front_door ({os.getpid()})"}
                         | {f"zinfer {name} ({pid})" for name, pid in children.items()})


def test_zinfer_run_trace_then_summarize(smollm2_path, tmp_path, capsys):
    out = tmp_path / "run.json"
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--model", str(smollm2_path), "--temperature", "0", "--max-tokens", "4", "--trace", str(out),
              "Hi"])
    assert exit_.value.code == 0
    assert "wrote" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert check_trace(doc) == []
    with pytest.raises(SystemExit) as exit_:
        main(["trace", "summarize", str(out)])
    table = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "prefill" in table and "decode" in table and "4 rounds" in table
    kernel_rows = table.split("\nkernel ", 1)[1].splitlines()[1:]
    assert {row.split()[0] for row in kernel_rows} >= {"linear", "attention", "embed"}
