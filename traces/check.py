"""Structural checks of a Chrome JSON trace, standing in for Perfetto's trace_processor
(which cannot run offline here): what would make a viewer drop or misdraw events."""

from __future__ import annotations

from typing import Any

TraceEvent = dict[str, Any]  # one event of a Chrome JSON trace ("ph", "pid", "tid", "ts", ...)

def _ns(us: float) -> int:
    return round(us * 1000)


def check_trace(doc: dict[str, Any]) -> list[str]:
    """Problems found (empty when the trace is sound): per track, timestamps that go
    backwards, B/E that do not balance, slices that overlap without nesting; flows
    without exactly one start and one end, ending before they start, or not on a slice."""
    problems: list[str] = []
    tracks: dict[tuple[int, int], list[TraceEvent]] = {}  # (pid, tid) -> its slice events
    flows: dict[tuple[str | None, int], list[TraceEvent]] = {}  # (cat, id) -> its flow events
    for e in doc.get("traceEvents", []):
        ph = e.get("ph")
        if ph in ("X", "B", "E"):
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
        elif ph in ("s", "t", "f"):
            flows.setdefault((e.get("cat"), e["id"]), []).append(e)
        elif ph != "M":
            problems.append(f"unexpected event phase {ph!r}")
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (pid, tid) -> (start, end) ns of its slices
    for key, events in tracks.items():
        last: int | None = None
        open_b: list[tuple[str, int]] = []  # (name, start ns) of each B not yet ended
        open_x: list[tuple[str, int]] = []  # (name, end ns) of the X slices enclosing this one
        spans[key] = []
        for e in events:
            ts = _ns(e["ts"])
            if last is not None and ts < last:
                problems.append(f"track {key}: {e['name']!r} at {e['ts']} goes back before {last / 1000}")
            last = ts
            if e["ph"] == "B":
                open_b.append((e["name"], ts))
            elif e["ph"] == "E":
                if not open_b:
                    problems.append(f"track {key}: E of {e['name']!r} at {e['ts']} without a B")
                else:
                    name, start = open_b.pop()
                    spans[key].append((start, ts))
            else:
                end = ts + _ns(e["dur"])
                if end < ts:
                    problems.append(f"track {key}: {e['name']!r} has a negative duration")
                while open_x and open_x[-1][1] <= ts:
                    open_x.pop()
                if open_x and end > open_x[-1][1]:
                    slice_ = f"{e['name']!r} [{e['ts']}, +{e['dur']}]"
                    problems.append(f"track {key}: {slice_} overlaps {open_x[-1][0]!r} without nesting")
                open_x.append((e["name"], end))
                spans[key].append((ts, end))
        for name, _ in open_b:
            problems.append(f"track {key}: B of {name!r} never ends")
    for flow, events in flows.items():
        starts = [e for e in events if e["ph"] == "s"]
        ends = [e for e in events if e["ph"] == "f"]
        if len(starts) != 1 or len(ends) != 1:
            problems.append(f"flow {flow}: {len(starts)} start(s) and {len(ends)} end(s)")
            continue
        s, f = starts[0], ends[0]
        if f["ts"] < s["ts"]:
            problems.append(f"flow {flow} ends before it starts")
        for e in (s, f):
            ts = _ns(e["ts"])
            if not any(a <= ts <= b for a, b in spans.get((e["pid"], e["tid"]), [])):
                problems.append(f"flow {flow}: its {e['ph']} event is on no slice")
    return problems
