"""The CUDA device's kernel clock: device time from CUDA events, for kernel spans (traces/kernels.py)."""

from __future__ import annotations

import time
from typing import Any

KernelEvent = tuple[str, Any, Any]  # (name, start, end): cupy Events from now(), None where none was recorded


class CudaEventClock:
    """Device time for CUDA ops: each clock read records a cupy Event on the current
    stream; resolve() synchronizes and converts them to ns since the round's first event,
    anchored at the host time of that first read. A read while the stream is being
    captured into a graph gives None (an event recorded there has no time), and events
    holding one are dropped. Runs only where cupy and a GPU exist."""

    def __init__(self) -> None:
        import cupy  # only where cupy and a GPU exist

        self._cupy = cupy
        self._origin: Any = None
        self._last: Any = None
        self._anchor = 0

    def now(self) -> Any:
        """A cupy Event recorded now on the current stream, or None while it is being captured."""
        stream = self._cupy.cuda.get_current_stream()
        try:
            if stream.is_capturing():
                return None
        except self._cupy.cuda.runtime.CUDARuntimeError:  # the query itself is refused mid-capture
            return None
        ev = self._cupy.cuda.Event()
        ev.record(stream)
        if self._origin is None:
            self._origin, self._anchor = ev, time.time_ns()
        self._last = ev
        return ev

    def resolve(self, events: list[KernelEvent]) -> tuple[int, list[tuple[str, int, int]]]:
        """(host ns of the round's first event, [(name, start ns, end ns) since it]); waits
        for the last event. Forgets the round's events."""
        events = [e for e in events if e[1] is not None and e[2] is not None]
        if not events or self._origin is None:
            self._origin = self._last = None
            return 0, []
        self._last.synchronize()
        ms, origin = self._cupy.cuda.get_elapsed_time, self._origin
        out = [(n, int(ms(origin, a) * 1e6), int(ms(origin, b) * 1e6)) for n, a, b in events]
        anchor, self._origin, self._last = self._anchor, None, None
        return anchor, out
