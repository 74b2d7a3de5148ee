"""Part files -> one Chrome JSON trace (the trace-event format Perfetto and chrome://tracing open).

Why Chrome JSON and not Perfetto's TrackEvent protobuf: it needs no package, a test
can parse and check it with `json`, and Perfetto's UI imports it; what we give up
(interning, compactness) matters little at these sizes.

Layout, per process (one per actor process, or one "engine" for all in one):
- a track per actor: the scheduler's `schedule` slices; the executor's round slices
  with `layer i` slices below them and kernel slices below those (or directly under
  the round for embed and the logits head);
- a track per request: request > tokenize, queue, and one slice per round the request
  took part in, each with a flow arrow to the executor's round slice; each
  scheduler `schedule` slice has a flow to the round it planned.
Slices that would overlap on a track without nesting (a request's choices queued at
once, say) move to an extra track of the same name, so every track nests properly.
Times are µs since the earliest slice (otherData.epoch_ns).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from zinfer.traces.config import REQUEST, REQUEST_SCOPED, SCHEDULE
from zinfer.traces.parts import Record, part_files, read_records

TraceDoc = dict[str, Any]
"""A Chrome JSON trace: {"traceEvents": [...], "displayTimeUnit", "otherData": {"epoch_ns", ...}}."""


@dataclass
class Slice:
    track: tuple[int, str]  # (pid, track name)
    name: str
    start: int  # epoch ns
    end: int
    cat: str
    args: dict[str, Any] | None = None
    tid: int = 0
    flows_out: list[int] = field(default_factory=list)
    flows_in: list[int] = field(default_factory=list)


def merge_records(records: Iterable[Record]) -> TraceDoc:
    """A Chrome JSON trace (as a dict) of every span and kernel record given."""
    spans: list[Record] = []
    kernels: list[Record] = []
    roles: dict[int, str] = {}  # pid -> role
    for r in records:
        roles[r["pid"]] = r["role"]
        (spans if r["k"] == "span" else kernels).append(r)
    by_id = {s["span"]: s for s in spans}
    slices: list[Slice] = []
    span_slice: dict[str, Slice] = {}
    for s in spans:
        sl = Slice(_track(s, by_id), s["name"], s["start"], s["end"], _category(s),
                   {**s["attrs"], "trace_id": s["trace"], "span_id": s["span"], "pid": s["pid"]})
        slices.append(sl)
        span_slice[s["span"]] = sl
    for k in kernels:
        parent = span_slice.get(k["parent"])
        track = parent.track if parent else (k["pid"], k["role"])
        off = k["offset"]
        for name, a, b in k["events"]:
            slices.append(Slice(track, name, a + off, b + off, "layer" if name.startswith("layer ") else "kernel"))
    flows = _flows(spans, by_id, span_slice, slices)
    return _emit(slices, flows, roles)


def merge_parts(paths: Iterable[str | os.PathLike[str]]) -> TraceDoc:
    """The Chrome JSON trace of every record in these part files."""
    return merge_records(read_records(paths))


def write_trace(directory: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> int:
    """Merge every part file in directory into out_path; returns the number of slices."""
    doc = merge_parts(part_files(directory))
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    return sum(1 for e in doc["traceEvents"] if e["ph"] == "X")


# ---- placing spans -------------------------------------------------------------------

def _request_of(s: Record | None, by_id: dict[str, Record]) -> Record | None:
    """The request span s lies under (s itself if it is one), or None."""
    while s is not None and s["name"] != REQUEST:
        s = by_id.get(s["parent"])
    return s


def _track(s: Record, by_id: dict[str, Record]) -> tuple[int, str]:
    if s["name"] in REQUEST_SCOPED:
        req = _request_of(s, by_id)
        if req is not None:
            return req["pid"], f"request {req['attrs'].get('request_id', req['span'])}"
        return s["pid"], s["name"]
    return s["pid"], s["attrs"].get("zinfer.actor") or s["role"]


def _category(s: Record) -> str:
    if s["name"] in REQUEST_SCOPED:
        return str(s["name"])
    if s["name"] == SCHEDULE:
        return "schedule"
    return "round" if "round_id" in s["attrs"] else "span"


def _flows(
    spans: list[Record],
    by_id: dict[str, Record],
    span_slice: dict[str, Slice],
    slices: list[Slice],
) -> list[tuple[Slice, Slice]]:
    """Request track round slices (added to slices) and every (source, target) flow."""
    flows: list[tuple[Slice, Slice]] = []
    rounds: dict[int, Slice] = {}  # round_id -> the executor's round slice
    for s in spans:
        target = span_slice[s["span"]]
        if target.cat != "round":
            continue
        rounds[s["attrs"]["round_id"]] = target
        seen: set[str] = set()
        for _, span_id in s["links"]:
            req = _request_of(by_id.get(span_id), by_id)
            if req is None or req["span"] in seen:
                continue
            seen.add(req["span"])
            mirror = Slice(span_slice[req["span"]].track, s["name"], s["start"], s["end"], "request.round",
                           {"round_id": s["attrs"]["round_id"], "round_span_id": s["span"]})
            slices.append(mirror)
            flows.append((mirror, target))
    for s in spans:
        if s["name"] == SCHEDULE and s["attrs"].get("round_id") in rounds:
            flows.append((span_slice[s["span"]], rounds[s["attrs"]["round_id"]]))
    return flows


def _layout(slices: list[Slice]) -> dict[tuple[int, int], str]:
    """Give every slice a tid so that slices on one tid nest; returns the name of each (pid, tid)."""
    groups: dict[tuple[int, str], list[Slice]] = {}
    for sl in slices:
        groups.setdefault(sl.track, []).append(sl)
    names: dict[tuple[int, int], str] = {}  # (pid, tid) -> track name
    next_tid: dict[int, int] = {}  # pid -> the last tid given
    for (pid, name), group in sorted(groups.items()):
        group.sort(key=lambda sl: (sl.start, -sl.end))
        lanes: list[tuple[int, list[int]]] = []  # (tid, stack of open end times)
        for sl in group:
            for tid, stack in lanes:  # noqa: B007 (after the break, tid is the lane found)
                while stack and stack[-1] <= sl.start:
                    stack.pop()
                if not stack or sl.end <= stack[-1]:
                    break
            else:
                tid = next_tid[pid] = next_tid.get(pid, 0) + 1
                stack = []
                lanes.append((tid, stack))
                names[(pid, tid)] = name if len(lanes) == 1 else f"{name} ({len(lanes)})"
            stack.append(sl.end)
            sl.tid = tid
    return names


def _emit(slices: list[Slice], flows: list[tuple[Slice, Slice]], roles: dict[int, str]) -> TraceDoc:
    names = _layout(slices)
    t0 = min((sl.start for sl in slices), default=0)

    def us(ns: int) -> float:
        return round((ns - t0) / 1000, 3)

    events: list[dict[str, Any]] = []
    for pid, role in sorted(roles.items()):
        process_name = {"name": f"zinfer {role} ({pid})"}
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": process_name})
    for (pid, tid), name in sorted(names.items()):
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    timed: list[tuple[int, int, int, dict[str, Any]]] = []  # (sort keys..., event)
    for sl in slices:
        e = {
            "ph": "X", "pid": sl.track[0], "tid": sl.tid, "name": sl.name, "cat": sl.cat,
            "ts": us(sl.start), "dur": round((sl.end - sl.start) / 1000, 3),
        }
        if sl.args:
            e["args"] = sl.args
        timed.append((sl.start, -(sl.end - sl.start), 0, e))
    for i, (src, dst) in enumerate(flows, 1):
        flow = {"name": "round", "cat": "flow", "id": i}
        start = {"ph": "s", "pid": src.track[0], "tid": src.tid, **flow, "ts": us(src.start)}
        end = {"ph": "f", "bp": "e", "pid": dst.track[0], "tid": dst.tid, **flow, "ts": us(dst.start)}
        timed += [(src.start, 1, 1, start), (dst.start, 1, 1, end)]
    timed.sort(key=lambda t: t[:3])
    events += [t[3] for t in timed]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"epoch_ns": t0, "generator": "zinfer"}}
