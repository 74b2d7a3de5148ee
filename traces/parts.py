"""Part files: each traced process appends its finished spans and kernel timings here.

One JSON object per line, written and flushed as each span ends, so a child process
that is killed loses nothing already finished. Two kinds of line:

    {"k": "span", "name", "trace", "span", "parent", "start", "end", "attrs", "links",
     "pid", "role"}                       (ids as hex, times as epoch ns)
    {"k": "kernels", "trace", "parent", "pid", "role", "offset", "events"}
                                          (events: [name, start, end] in clock ns;
                                           epoch ns = clock ns + offset)

With window_s > 0 a writer starts a new file every window (`<window start>-<role>-<pid>.jsonl`),
so a long-running server's trace can be merged and removed window by window.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

import msgspec
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

_encode = msgspec.json.Encoder().encode

Record = dict[str, Any]
"""One line of a part file, a "span" or a "kernels" record (fields in the module docstring)."""


class PartWriter:
    """Appends records to this process's part file in `directory` (thread-safe)."""

    def __init__(self, directory: str, role: str, window_s: float = 0.0):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.role, self.pid, self.window_s = role, os.getpid(), window_s
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._window: int | None = None

    def _path(self, window: int | None) -> Path:
        stem = f"{self.role}-{self.pid}" if window is None else f"{window}-{self.role}-{self.pid}"
        return self.dir / f"{stem}.jsonl"

    def write(self, *records: Record) -> None:
        """Append records, one line each, in one write; flush them to the OS."""
        lines = b"".join([_encode(r) + b"\n" for r in records])
        with self._lock:
            window = int(time.time() // self.window_s * self.window_s) if self.window_s else None
            if self._file is None or window != self._window:
                if self._file is not None:
                    self._file.close()
                self._file, self._window = open(self._path(window), "ab"), window
            self._file.write(lines)
            self._file.flush()

    def span_record(self, name: str, trace: str, span: str, parent: str | None, start: int, end: int,
                    attrs: dict[str, Any], links: Sequence[Sequence[str]]) -> Record:
        """A "span" line of this process (ids as hex strings, times as epoch ns)."""
        return {"k": "span", "name": name, "trace": trace, "span": span, "parent": parent, "start": start,
                "end": end, "attrs": attrs, "links": links, "pid": self.pid, "role": self.role}

    def kernels_record(self, trace: str, parent: str, offset: int, events: list[tuple[str, int, int]]) -> Record:
        """A "kernels" line: a round's events under its span `parent`."""
        return {"k": "kernels", "trace": trace, "parent": parent, "pid": self.pid, "role": self.role,
                "offset": offset, "events": events}

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class PartSpanProcessor(SpanProcessor):
    """Writes each span to a PartWriter as it ends (in the thread that ends it)."""

    def __init__(self, writer: PartWriter):
        self.writer = writer

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        self.writer.write(self.writer.span_record(
            span.name,
            f"{ctx.trace_id:032x}",
            f"{ctx.span_id:016x}",
            f"{span.parent.span_id:016x}" if span.parent else None,
            span.start_time or 0,  # set: the span has started and ended
            span.end_time or 0,
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in (span.attributes or {}).items()},
            [[f"{l.context.trace_id:032x}", f"{l.context.span_id:016x}"] for l in span.links],
        ))

    def shutdown(self) -> None:
        self.writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def part_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The part files in directory, in name order."""
    return sorted(Path(directory).glob("*.jsonl"))


def read_records(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Record]:
    """Every record in these part files; a torn last line (a killed writer) is skipped."""
    decode = msgspec.json.Decoder().decode
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break
                try:
                    yield decode(line)
                except msgspec.DecodeError:
                    continue
