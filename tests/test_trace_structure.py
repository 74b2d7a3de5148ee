"""Trace plumbing without a model: traceparents, the kernel recorder, merging part files
into a Chrome JSON trace, the structural checker that stands in for Perfetto's
trace_processor, and the per-window merge of `zinfer serve --trace-dir`."""

from __future__ import annotations

import json
import time

import pytest

from zinfer.traces.check import check_trace
from zinfer.traces.config import TraceConfig
from zinfer.traces.context import format_traceparent, parse_traceparent
from zinfer.traces.kernels import KERNEL_OPS, KernelRecorder
from zinfer.traces.merge import merge_parts, merge_records
from zinfer.traces.parts import part_files
from zinfer.traces.rounds import RoundTracer
from zinfer.traces.setup import Tracing, open_tracing
from zinfer.traces.summarize import summarize
from zinfer.traces.windows import merge_windows, parts_dir


def test_traceparent_round_trip_and_garbage():
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sc = parse_traceparent(tp)
    assert sc.trace_id == 0x0AF7651916CD43DD8448EB211C80319C and sc.is_remote
    assert format_traceparent(sc) == tp
    for bad in (None, "", "junk", "00-xyz-b7ad6b7169203331-01", "00-" + "0" * 32 + "-b7ad6b7169203331-01"):
        assert parse_traceparent(bad) is None


def test_tracing_off_builds_nothing():
    assert open_tracing(TraceConfig(), "engine") is None
    with pytest.raises(ValueError):
        TraceConfig(dir="x", otlp_endpoint="localhost:4318").validate()


class FakeDevice:
    name = "fake"

    def __getattr__(self, op):
        return lambda *a, **k: (op, a)


def test_recorder_times_every_op_and_layer_and_passes_the_rest_through():
    rec = KernelRecorder()
    dev = rec.wrap(FakeDevice())
    assert dev.name == "fake" and dev.to_numpy(1) == ("to_numpy", (1,))
    rec.begin_layer(0)
    for op in KERNEL_OPS:
        assert getattr(dev, op)(1, 2) == (op, (1, 2))
    rec.end_layer(0)
    offset, events = rec.take()
    assert [e[0] for e in events] == [*KERNEL_OPS, "layer 0"]
    assert all(a <= b for _, a, b in events) and events[-1][1] <= events[0][1]
    assert rec.take() == (None, [])
    n = 20000
    t0 = time.perf_counter_ns()
    for _ in range(n):
        dev.glu(1, 2)
    per_call = (time.perf_counter_ns() - t0) / n
    plain = FakeDevice().glu
    t0 = time.perf_counter_ns()
    for _ in range(n):
        plain(1, 2)
    print(f"\nkernel recorder: {per_call:.0f} ns per timed call vs {(time.perf_counter_ns() - t0) / n:.0f} ns untimed")


def _span(name, sid, parent, start, end, pid=10, trace="t" * 32, attrs=None, links=()):
    return {"k": "span", "name": name, "trace": trace, "span": sid, "parent": parent, "start": start, "end": end,
            "attrs": attrs or {}, "links": [[trace, l] for l in links], "pid": pid, "role": "engine"}


def synthetic_records() -> list[dict]:
    """One request with two choices queued at once, and a round shared with a second request."""
    us = 1000
    return [
        _span("request", "r1", None, 0, 100 * us, attrs={"request_id": "a"}),
        _span("tokenize", "k1", "r1", 1 * us, 2 * us),
        _span("queue", "q1", "r1", 3 * us, 20 * us, pid=11),
        _span("queue", "q2", "r1", 4 * us, 21 * us, pid=11),  # overlaps q1 without nesting
        _span("request", "r2", None, 5 * us, 90 * us, attrs={"request_id": "b"}),
        _span("schedule", "s1", "r1", 21 * us, 22 * us, pid=11, attrs={"round_id": 1, "zinfer.actor": "scheduler"}),
        _span("decode", "x1", "r1", 30 * us, 60 * us, pid=12, links=("r1", "r2"),
              attrs={"round_id": 1, "batch_size": 2, "tokens": 2, "zinfer.actor": "executor"}),
        {"k": "kernels", "trace": "t" * 32, "parent": "x1", "pid": 12, "role": "executor", "offset": 0,
         "events": [["embed", 31 * us, 32 * us], ["linear", 33 * us, 40 * us], ["glu", 41 * us, 50 * us],
                    ["layer 0", 33 * us, 51 * us], ["linear", 52 * us, 59 * us]]},
    ]


def test_merged_trace_is_sound_and_draws_requests_rounds_and_flows():
    doc = merge_records(synthetic_records())
    assert check_trace(doc) == []
    ev = doc["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"request a", "request a (2)", "request b", "executor", "scheduler"} <= set(threads.values())
    # both requests show the shared round on their own track, with an arrow to the executor's
    mirrors = [e for e in ev if e.get("cat") == "request.round"]
    assert sorted(threads[(e["pid"], e["tid"])] for e in mirrors) == ["request a", "request b"]
    flows = [e for e in ev if e["ph"] in "sf"]
    assert len(flows) == 2 * 3  # two requests + the scheduler -> the round
    table = summarize(doc)
    assert "decode" in table and "linear" in table and "1 rounds" in table


@pytest.mark.parametrize("mutate, problem", [
    (lambda ev: ev.reverse(), "goes back"),
    (lambda ev: ev.append({"ph": "X", "pid": 1, "tid": 1, "name": "late", "ts": 5.0, "dur": 100.0}), "without nesting"),
    (lambda ev: ev.append({"ph": "s", "pid": 1, "tid": 1, "name": "f", "cat": "flow", "id": 99, "ts": 1.0}),
     "1 start(s) and 0 end(s)"),
    (lambda ev: ev.append({"ph": "B", "pid": 1, "tid": 1, "name": "open", "ts": 50.0}), "never ends"),
    (lambda ev: ev.append({"ph": "E", "pid": 1, "tid": 2, "name": "open", "ts": 50.0}), "without a B"),
])
def test_checker_catches_what_a_viewer_would_misdraw(mutate, problem):
    ev = [{"ph": "X", "pid": 1, "tid": 1, "name": "round", "ts": 0.0, "dur": 10.0},
          {"ph": "X", "pid": 1, "tid": 1, "name": "layer", "ts": 1.0, "dur": 5.0}]
    assert check_trace({"traceEvents": list(ev)}) == []
    mutate(ev)
    assert any(problem in p for p in check_trace({"traceEvents": ev})), check_trace({"traceEvents": ev})


def test_spans_written_by_a_tracing_reach_the_merged_trace(tmp_path):
    tracing = Tracing(TraceConfig(dir=str(tmp_path)), "engine", {"zinfer.model": "m"})
    req = tracing.start("request", None, {"request_id": "x"})
    rt = RoundTracer(tracing, FakeDevice())
    rt.run(lambda dev, marks: (marks.begin_layer(0), dev.linear(1), marks.end_layer(0)), rt.device)
    rt.finish("decode", {"round_id": 1}, [tracing.traceparent(req)])
    req.end()
    tracing.close()
    doc = merge_parts(part_files(tmp_path))
    assert check_trace(doc) == []
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted(names) == ["decode", "decode", "layer 0", "linear", "request"]  # the round, mirrored on the request


def test_a_recorded_span_is_written_as_the_sdk_would_write_it(tmp_path):
    """record() skips the SDK span; its part-file lines match start().end()'s but for ids."""
    tracing = Tracing(TraceConfig(dir=str(tmp_path)), "engine")
    parent = tracing.traceparent(tracing.start("request"))
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    attrs = {"round_id": 3, "seq_ids": [1, 2], "zinfer.actor": "x", "gone": None}
    tracing.start("sdk", parent, attrs, [parent, other, "junk"], 1000).end(end_time=2000)
    tracing.record("direct", parent, attrs, [parent, other, "junk"], 1000, 2000, (5, [("linear", 1, 2)]))
    tracing.record("orphan", "junk", attrs, (), 1000, 2000)
    tracing.start("sdk unsampled", unsampled, attrs).end()
    tracing.record("direct unsampled", unsampled, attrs)
    tracing.close()
    lines = [json.loads(line) for path in part_files(tmp_path) for line in path.read_text().splitlines()]
    sdk, direct, kernels, orphan = (next(r for r in lines if r.get("name", r["k"]) == n)
                                    for n in ("sdk", "direct", "kernels", "orphan"))
    same = lambda r: {k: v for k, v in r.items() if k not in ("name", "span")}  # noqa: E731
    assert same(sdk) == same(direct) and direct["trace"] == parent.split("-")[1] and direct["span"] != sdk["span"]
    assert direct["links"] == [parent.split("-")[1:3], other.split("-")[1:3]]
    assert kernels["parent"] == direct["span"] and kernels["events"] == [["linear", 1, 2]] and kernels["offset"] == 5
    assert orphan["parent"] is None and orphan["trace"] != direct["trace"]
    assert not [r for r in lines if "unsampled" in r.get("name", "")]


def test_otlp_endpoint_without_the_exporter_still_traces_to_files(tmp_path):
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        pytest.skip("the OTLP exporter is installed")
    except ImportError:
        pass
    tracing = Tracing(TraceConfig(dir=str(tmp_path), otlp_endpoint="http://127.0.0.1:9/v1/traces"), "engine")
    tracing.start("request").end()
    tracing.close()
    assert len(part_files(tmp_path)) == 1


def test_serve_windows_merge_only_finished_windows(tmp_path):
    d = parts_dir(tmp_path)
    d.mkdir()
    recs = synthetic_records()
    for window in (1000, 1060):
        (d / f"{window}-engine-10.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"torn')
    written = merge_windows(tmp_path, 60, now=1060 + 30)
    assert [p.name for p in written] == ["zinfer-19700101-001640.json"]
    assert check_trace(json.loads(written[0].read_text())) == []
    assert [p.name for p in d.iterdir()] == ["1060-engine-10.jsonl"]
    assert len(merge_windows(tmp_path, 60, now=1060 + 30, final=True)) == 1 and not list(d.iterdir())
