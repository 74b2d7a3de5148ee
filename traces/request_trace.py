"""One request's slice of a running server's trace, as Perfetto-loadable JSON.

`zinfer serve --trace-dir DIR` writes spans to DIR/parts and merges each finished
--trace-window into DIR/zinfer-<UTC start>.json (traces/windows.py), so one request's
spans can lie in two or more files: each span lands in the window where it ended. This
finds the request's `request` slice (in the part files not merged yet, else in the
newest window file that has it), then gathers from every file whose window overlaps it
all slices that overlap the request's time: its own track (tokenize, queue, its rounds),
the executor's rounds with their layers and kernels, and the scheduler's `schedule`
slices. Requests served at the same time show up on their own tracks, as they shared
those rounds. Flows (request round -> executor round, schedule -> round) are rebuilt
from the slices' ids, and tracks are laid out again (traces/merge.py). A window merged without the request span
left its tokenize and queue slices on tracks of their own and drew no request round
slices: those are put back on the request's track, for the rounds the request led.
"""

from __future__ import annotations

import calendar
import json
import os
import time
from pathlib import Path
from typing import Any

from zinfer.traces.merge import Slice, TraceDoc, _emit, merge_parts
from zinfer.traces.windows import parts_dir


def is_request(args: dict[str, Any], request_id: str) -> bool:
    """Whether a request slice's args name request_id: the id itself, or a gateway's
    prefixed form of it (the websocket sends `ws<N>.<id>` to the engine)."""
    rid = str(args.get("request_id", ""))
    return rid == request_id or rid.endswith("." + request_id)


def window_files(trace_dir: str | os.PathLike[str]) -> list[tuple[float, Path]]:
    """(window start in epoch seconds, file) of each merged trace file, newest first."""
    out: list[tuple[float, Path]] = []
    for p in Path(trace_dir).glob("zinfer-*.json"):
        try:
            out.append((calendar.timegm(time.strptime(p.stem[len("zinfer-"):], "%Y%m%d-%H%M%S")), p))
        except ValueError:
            continue
    return sorted(out, reverse=True)


def _slices(doc: TraceDoc) -> tuple[list[Slice], dict[int, str]]:
    """The X events of a Chrome JSON trace made by merge.py back into Slices (epoch ns), and
    each pid's role."""
    epoch = doc.get("otherData", {}).get("epoch_ns", 0)
    roles: dict[int, str] = {}  # pid -> role
    threads: dict[tuple[int, int], str] = {}  # (pid, tid) -> track name
    out: list[Slice] = []
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            roles[e["pid"]] = e["args"]["name"].removeprefix("zinfer ").rsplit(" (", 1)[0]
        elif e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            track = threads.get((e["pid"], e["tid"]), "")
            if track.endswith(")") and " (" in track:  # a lane: "request x (2)"
                track = track.rsplit(" (", 1)[0]
            start = epoch + round(e["ts"] * 1000)
            end = start + round(e["dur"] * 1000)
            out.append(Slice((e["pid"], track), e["name"], start, end, e.get("cat", ""), e.get("args")))
    return out, roles


def _flows(slices: list[Slice]) -> list[tuple[Slice, Slice]]:
    """merge.py's flows again: each request's round slice to the executor's round, each
    schedule slice to the round it planned."""
    rounds = {sl.args["span_id"]: sl for sl in slices if sl.cat == "round" and sl.args}
    by_round_id = {sl.args.get("round_id"): sl for sl in rounds.values() if sl.args}
    flows: list[tuple[Slice, Slice]] = []
    for sl in slices:
        if not sl.args:
            continue
        if sl.cat == "request.round" and sl.args.get("round_span_id") in rounds:
            flows.append((sl, rounds[sl.args["round_span_id"]]))
    for sl in slices:
        if sl.args and sl.cat == "schedule" and sl.args.get("round_id") in by_round_id:
            flows.append((sl, by_round_id[sl.args["round_id"]]))
    return flows


def request_trace(trace_dir: str | os.PathLike[str], request_id: str, window_s: float) -> TraceDoc | None:
    """The Chrome JSON trace (Perfetto opens it) of request_id's time in the server's trace
    under trace_dir (window_s: its --trace-window); None when no file there has the
    request's finished request span."""
    parts = sorted(parts_dir(trace_dir).glob("*.jsonl"))
    try:
        current = _slices(merge_parts(parts))
    except FileNotFoundError:  # a window merged (and its parts removed) while we read
        current = _slices(merge_parts(p for p in parts if p.exists()))
    windows = window_files(trace_dir)
    loaded: dict[Path, tuple[list[Slice], dict[int, str]]] = {}

    def load(path: Path) -> tuple[list[Slice], dict[int, str]]:
        if path not in loaded:
            with open(path) as f:
                loaded[path] = _slices(json.load(f))
        return loaded[path]

    def find(doc: tuple[list[Slice], dict[int, str]]) -> Slice | None:
        return next((sl for sl in doc[0] if sl.cat == "request" and sl.args and is_request(sl.args, request_id)), None)

    found = find(current) or next(filter(None, (find(load(path)) for _, path in windows)), None)
    if found is None:
        return None
    s, e = found.start, found.end
    docs = [current, *(load(path) for start, path in windows if start * 1e9 < e and (start + window_s) * 1e9 > s)]
    slices: list[Slice] = []
    roles: dict[int, str] = {}
    for doc_slices, doc_roles in docs:
        slices += [sl for sl in doc_slices if sl.start < e and sl.end > s]
        roles.update(doc_roles)
    _onto_request_track(slices, found)
    return _emit(slices, _flows(slices), roles)


def _onto_request_track(slices: list[Slice], request: Slice) -> None:
    """Put back on the request's track what a window without its request span left off it:
    its tokenize and queue slices, and a round slice for each round it led (adds those)."""
    trace = (request.args or {}).get("trace_id")
    mirrored = {sl.args.get("round_span_id") for sl in slices if sl.cat == "request.round" and sl.args}
    for sl in list(slices):
        if not sl.args or sl.args.get("trace_id") != trace:
            continue
        if sl.cat in ("tokenize", "queue"):
            sl.track = request.track
        elif sl.cat == "round" and sl.args.get("span_id") not in mirrored:
            slices.append(Slice(request.track, sl.name, sl.start, sl.end, "request.round",
                                {"round_id": sl.args.get("round_id"), "round_span_id": sl.args["span_id"]}))
