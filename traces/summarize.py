"""`zinfer trace summarize FILE`: per-round and per-kernel time tables of a merged trace."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoundTimes:
    """One executor round as the trace shows it (times in µs)."""

    name: str
    args: dict[str, Any]  # the round span's attributes (round_id, batch_size, tokens, ...)
    dur: float
    layers: int = 0
    kernel_us: float = 0.0
    kernels: dict[str, list[float]] = field(default_factory=dict)  # name -> durations


def rounds_of(doc: dict[str, Any]) -> list[RoundTimes]:
    """Every round slice with the layer and kernel slices inside it, in time order."""
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = {}  # (pid, tid) -> its X events
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("round", "layer", "kernel"):
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    rounds: list[tuple[float, RoundTimes]] = []
    for events in by_track.values():
        current, end = None, 0.0
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            if e["cat"] == "round":
                current, end = RoundTimes(e["name"], e.get("args", {}), e["dur"]), e["ts"] + e["dur"]
                rounds.append((e["ts"], current))
            elif current is not None and e["ts"] <= end:
                if e["cat"] == "layer":
                    current.layers += 1
                else:
                    current.kernel_us += e["dur"]
                    current.kernels.setdefault(e["name"], []).append(e["dur"])
    return [r for _, r in sorted(rounds, key=lambda t: t[0])]


def summarize(doc: dict[str, Any]) -> str:
    """The two tables as text: rounds (kind, batch, tokens, time, kernel coverage) and
    kernels (calls, total, mean, share of round time)."""
    rounds = rounds_of(doc)
    lines = [
        f"{'round':>5} {'kind':<16} {'batch':>5} {'tokens':>6} {'ms':>9} {'kernels ms':>10} {'cover':>6} {'layers':>6}"
    ]
    for r in rounds:
        cover = 100 * r.kernel_us / r.dur if r.dur else 0.0
        round_id, batch, tokens = r.args.get("round_id", "?"), r.args.get("batch_size", ""), r.args.get("tokens", "")
        lines.append(f"{round_id:>5} {r.name:<16} {batch:>5} {tokens:>6} "
                     f"{r.dur / 1000:9.3f} {r.kernel_us / 1000:10.3f} {cover:5.1f}% {r.layers:>6}")
    total_round = sum(r.dur for r in rounds)
    lines.append(f"{len(rounds)} rounds, {total_round / 1000:.3f} ms")
    lines.append("")
    per: dict[str, list[float]] = {}
    for r in rounds:
        for name, durs in r.kernels.items():
            per.setdefault(name, []).extend(durs)
    lines.append(f"{'kernel':<12} {'calls':>7} {'total ms':>10} {'mean us':>9} {'share':>6}")
    for name, durs in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        total = sum(durs)
        share = 100 * total / total_round if total_round else 0.0
        lines.append(f"{name:<12} {len(durs):>7} {total / 1000:10.3f} {total / len(durs):9.2f} {share:5.1f}%")
    return "\n".join(lines)


def summarize_file(path: str) -> str:
    """summarize() of the trace file at path (OSError, ValueError: unreadable or not JSON)."""
    with open(path) as f:
        return summarize(json.load(f))
