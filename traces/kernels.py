"""Kernel and layer timings at well under a microsecond each, merged into the trace at export.

An OpenTelemetry span costs more than many kernels (BENCHMARKS.md, traces/kernels.py); so a
round's device ops are timed by a KernelRecorder (a clock read and a list append) through a
TracedDevice that wraps the real one, and the forward marks layer boundaries on the
same recorder. The executor writes the round's events as one record under its round
span (traces/rounds.py); the merge step turns them into layer and kernel slices.

The clock is the device's (Device.kernel_clock): the default reads time.perf_counter_ns
on the host, right for devices whose ops finish before they return (numpy, numba). An
asynchronous device (CUDA) gives a clock that records device events and resolves them
to nanoseconds once the round has synchronized (devices/cuda_clock.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

# The Device protocol's ops (devices/base.py) that run kernels.
KERNEL_OPS = ("embed", "rms_norm", "linear", "linears", "rope", "write_kv", "attention", "glu")

KernelEvent = tuple[str, Any, Any]
"""(name, start, end) in the clock's stamps: host ns, or a device's event objects until resolved."""
TimedEvent = tuple[str, int, int]
"""(name, start, end) in clock ns, as a part file's "kernels" record stores them."""


class KernelClock(Protocol):
    """What Device.kernel_clock() returns when it is not None (devices/cuda_clock.py)."""

    def now(self) -> Any:
        """A stamp for an event's start or end."""

    def resolve(self, events: list[KernelEvent]) -> tuple[int | None, list[TimedEvent]]:
        """(offset to epoch ns, None: perf_counter_ns's; the events in ns) for a finished round."""

_layer_names: list[str] = []


def layer_name(i: int) -> str:
    """The name of layer i's slices, "layer i" (each made once per process)."""
    while len(_layer_names) <= i:
        _layer_names.append(f"layer {len(_layer_names)}")
    return _layer_names[i]


class HostClock:
    """Host nanoseconds; ops are synchronous, so host time is kernel time."""

    now = staticmethod(time.perf_counter_ns)

    def resolve(self, events: list[KernelEvent]) -> tuple[int | None, list[TimedEvent]]:
        """(offset to epoch ns, events in clock ns) for a finished round; None: the
        offset of perf_counter_ns, which the round span shares."""
        return None, events


class KernelRecorder:
    """One round's (name, start, end) events, kernels and layers alike, in clock units.

    Not thread-safe: one forward records at a time (the executor runs one round at once).
    """

    def __init__(self, clock: KernelClock | None = None):
        self.clock: KernelClock = clock or HostClock()
        self.now: Callable[[], Any] = self.clock.now
        self.events: list[KernelEvent] = []
        self._layer_start: Any = 0

    def begin_layer(self, i: int) -> None:
        self._layer_start = self.now()

    def end_layer(self, i: int) -> None:
        self.events.append((layer_name(i), self._layer_start, self.now()))

    def take(self) -> tuple[int | None, list[TimedEvent]]:
        """The events recorded since the last take, resolved: (offset to epoch ns, events)."""
        events, self.events = self.events, []
        return self.clock.resolve(events)

    def wrap(self, device: Any) -> "TracedDevice":
        return TracedDevice(device, self)


class TracedDevice:
    """The device with every kernel op timed into a recorder; all else passes through.

    run_round hands the real device's run_round a layers that runs on timed ops: this
    wrapper where the device passes itself, a timed wrapper of whatever else it passes
    (cpu-fast's recorder of a decode graph). The real device decides how the round runs
    (a CUDA graph replay records no kernel spans; a cpu-fast one is one span) and is no
    span itself otherwise. begin_round called on the wrapper is one, "begin_round"."""

    def __init__(self, device: Any, recorder: KernelRecorder):
        self.device = device
        self._recorder = recorder
        for op in KERNEL_OPS:
            setattr(self, op, _timed(op, getattr(device, op), recorder))
        if hasattr(device, "begin_round"):
            self.begin_round = _timed("begin_round", device.begin_round, recorder)

    def run_round(self, layers: Callable[[Any, Any], Any], batch: Any, kv: Any) -> Any:
        """The real device's round, layers(ops, ctx) on timed ops. A round that cpu-fast
        replayed from a decode graph is one span, "graph_replay"."""

        def timed_layers(ops: Any, ctx: Any) -> Any:
            return layers(self if ops is self.device else TracedDevice(ops, self._recorder), ctx)

        t0 = self._recorder.now()
        out = self.device.run_round(timed_layers, batch, kv)
        if getattr(self.device, "last_round_replayed", False):
            self._recorder.events.append(("graph_replay", t0, self._recorder.now()))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


def _timed(name: str, fn: Callable[..., Any], rec: KernelRecorder) -> Callable[..., Any]:
    now = rec.now

    def op(*args: Any, **kwargs: Any) -> Any:
        t0 = now()
        out = fn(*args, **kwargs)
        rec.events.append((name, t0, now()))
        return out

    op.__name__ = name
    return op
