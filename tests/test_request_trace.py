"""traces/request_trace.py: one request's trace out of a server's --trace-dir, when its
spans lie in a merged window file and in the part files of the window after it."""

from __future__ import annotations

import json

from zinfer.traces.request_trace import request_trace
from zinfer.traces.windows import merge_windows, parts_dir

WINDOW_S = 60.0
W1 = 1_800_000_000  # a window start, epoch seconds
NS = 1_000_000_000
T, OTHER = "a" * 32, "b" * 32


def span(name, trace, span_id, parent, start_s, end_s, attrs=None, links=()):
    return {"k": "span", "name": name, "trace": trace, "span": span_id, "parent": parent, "start": int(start_s * NS),
            "end": int(end_s * NS), "attrs": attrs or {}, "links": [list(link) for link in links], "pid": 7,
            "role": "engine"}


def write(trace_dir, window_start, records):
    path = parts_dir(trace_dir) / f"{window_start}-engine-7.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def round_span(n, trace, parent, start_s, end_s):
    return span("decode" if n > 1 else "prefill", trace, f"{n:016x}", parent, start_s, end_s,
                {"round_id": n, "zinfer.actor": "executor"}, [(trace, parent)])


def test_a_request_split_over_two_windows_comes_back_whole(tmp_path):
    req = "00000000000000aa"
    # window 1 (merged into a trace file): tokenize, queue, round 1 with its kernels and schedule slice
    write(tmp_path, W1, [
        span("tokenize", T, "00000000000000b1", req, W1 + 58.0, W1 + 58.1),
        span("queue", T, "00000000000000b2", req, W1 + 58.1, W1 + 58.2),
        span("schedule", "c" * 32, "00000000000000c1", None, W1 + 58.2, W1 + 58.21,
             {"round_id": 1, "zinfer.actor": "scheduler"}),
        round_span(1, T, req, W1 + 58.3, W1 + 59.0),
        {"k": "kernels", "trace": T, "parent": f"{1:016x}", "pid": 7, "role": "engine", "offset": 0,
         "events": [["layer 0", int((W1 + 58.3) * NS), int((W1 + 58.6) * NS)],
                    ["matmul", int((W1 + 58.31) * NS), int((W1 + 58.5) * NS)]]},
        span("request", OTHER, "00000000000000dd", None, W1 + 10, W1 + 11, {"request_id": "ws1.other"}),  # long before
    ])
    assert merge_windows(tmp_path, WINDOW_S, final=True)
    # window 2 (still part files): round 2 and the request span, which ends last
    write(tmp_path, W1 + 60, [
        round_span(2, T, req, W1 + 60.1, W1 + 60.4),
        span("request", T, req, None, W1 + 58.0, W1 + 60.5, {"request_id": "ws3.mine", "zinfer.actor": "front_door"}),
    ])

    doc = request_trace(tmp_path, "mine", WINDOW_S)
    events = doc["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    on = {}
    for e in events:
        if e["ph"] == "X":
            on.setdefault(threads[(e["pid"], e["tid"])].split(" (")[0], []).append((e["cat"], e["name"]))
    # the request's track has all of it again: itself, tokenize, queue and both rounds
    assert sorted(on["request ws3.mine"]) == sorted([("request", "request"), ("tokenize", "tokenize"),
                                                     ("queue", "queue"), ("request.round", "prefill"),
                                                     ("request.round", "decode")])
    assert sorted(on["executor"]) == sorted([("round", "prefill"), ("round", "decode"), ("layer", "layer 0"),
                                             ("kernel", "matmul")])
    assert on["scheduler"] == [("schedule", "schedule")]
    assert not any("other" in name for name in threads.values())  # outside the request's time
    flows = [e for e in events if e["ph"] in "sf"]
    assert len(flows) == 2 * 3  # two request rounds -> executor rounds, one schedule -> round
    assert request_trace(tmp_path, "other", WINDOW_S) is not None  # the older one, from the window file
    assert request_trace(tmp_path, "nope", WINDOW_S) is None
    assert request_trace(tmp_path, "ine", WINDOW_S) is None  # a suffix after the prefix's dot only
