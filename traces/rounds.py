"""The executor's side of tracing: one span per round, its layers and kernels below it.

The round span covers exactly the round (device.run_round and the logits' copy to the
host, as timed in the worker thread), so the layer and kernel slices the recorder adds
under it account for nearly all of it; the gap is the forward's own Python between
device calls and the round's set-up (begin_round).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from zinfer.traces.kernels import KernelClock
from zinfer.traces.setup import Tracing


class RoundTracer:
    """Times an executor's rounds. `device` is what the forward should run on: the real
    device, or it wrapped in a kernel timer when kernels are traced. `clock`: the
    device's kernel_clock() (None: host time)."""

    def __init__(self, tracing: Tracing, device: Any, clock: KernelClock | None = None):
        self.tracing = tracing
        self.recorder = tracing.kernel_recorder(clock)
        self.device = self.recorder.wrap(device) if self.recorder else device
        self._span_ns = (0, 0)

    def run(self, round_fn: Callable[..., Any], *args: Any) -> Any:
        """round_fn(*args, marks=recorder) between the round's start and end marks; call
        it where the round runs (the worker thread)."""
        t0 = time.perf_counter_ns()
        try:
            return round_fn(*args, marks=self.recorder)
        finally:
            self._span_ns = (t0, time.perf_counter_ns())

    def finish(self, name: str, attributes: dict[str, Any], traceparents: list[str]) -> None:
        """Emit the span of the round just run: child of its first request, linked to all."""
        attributes["zinfer.actor"] = "executor"
        host_offset = time.time_ns() - time.perf_counter_ns()
        t0, t1 = (t + host_offset for t in self._span_ns)
        kernels = None
        if self.recorder is not None:
            offset, events = self.recorder.take()
            kernels = (host_offset if offset is None else offset, events)
        self.tracing.record(name, traceparents[0] if traceparents else None, attributes, traceparents, t0, t1, kernels)
