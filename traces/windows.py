"""`zinfer serve --trace-dir DIR`: part files roll over per time window, and each
finished window is merged into its own trace file, DIR/zinfer-<UTC start>.json.

A request that spans two windows has its spans split between their files (each span
lands in the window where it ended).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from zinfer.traces.merge import merge_parts

GRACE_S = 2.0  # wait this long past a window's end for its last spans


def parts_dir(trace_dir: str | os.PathLike[str]) -> Path:
    """Where the engine's processes write their part files under a --trace-dir."""
    return Path(trace_dir) / "parts"


def merge_windows(
    trace_dir: str | os.PathLike[str],
    window_s: float,
    now: float | None = None,
    final: bool = False,
) -> list[Path]:
    """Merge every finished window's part files (all of them if final) into a trace file
    in trace_dir, then delete those parts; returns the files written."""
    now = time.time() if now is None else now
    windows: dict[int, list[Path]] = {}
    for p in parts_dir(trace_dir).glob("*-*-*.jsonl"):
        head = p.name.split("-", 1)[0]
        if head.isdigit():
            windows.setdefault(int(head), []).append(p)
    written = []
    for start, paths in sorted(windows.items()):
        if not final and start + window_s + GRACE_S > now:
            continue
        doc = merge_parts(sorted(paths))
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(start))
        out = Path(trace_dir) / f"zinfer-{stamp}.json"
        tmp = out.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, out)
        for p in paths:
            p.unlink()
        written.append(out)
    return written
