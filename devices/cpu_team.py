"""How many threads cpu-fast's next round runs on, chosen from how fast recent rounds ran.

numba's parallel kernels split each loop statically between the threads and wait for
the last thread at the end of every parallel region, and libgomp's (numba's `omp`
threading layer) waiting threads spin for milliseconds before they sleep. When another
process takes a core, one thread of the team keeps losing it, each of a decode round's
~150-250 regions waits for it, and the spinning of the others takes CPU from the thread
that works: the team can then run several times slower than one thread.

So the device times every round and keeps, per round shape, an estimate of a round's
seconds on the whole team and on one thread. A round runs on whichever is faster; the
other is probed now and then (spending at most about PROBE_SHARE of the time on the
slower choice) so that the team comes back when the other process goes, and is dropped
within a few rounds when one comes. A shape seen for the first time starts on the count
the machine's state calls for: one thread while some shape's team was lately much slower
than one thread (only another process's load does that), else the team; rare shapes (a
prefill's chunks) never pay for probes. Thread counts never change results: every
parallel kernel splits output rows between threads, never a reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable

EMA = 0.3  # weight of a new round in the running estimate of the count it ran on
PROBE_SHARE = 0.01  # a probe of the slower count is followed by rounds that take ~1/PROBE_SHARE times its extra cost
MIN_PROBE_GAP_S = 0.25  # probes of a shape at least this far apart ...
MIN_PROBE_ROUNDS = 8  # ... and this many rounds apart
MAX_PROBE_GAP_S = 30.0  # the slower count is probed again at least this often (so a gone load is noticed)
BUSY_RATIO = 1.5  # a team this much slower than one thread means other processes hold cores: new shapes start on one


@dataclass
class _Shape:
    """What the governor knows of one round shape."""

    current: int  # the thread count its rounds run on
    seconds: dict[int, float] = field(default_factory=dict)  # thread count -> estimated seconds per round
    warm: bool = False  # its first round (compiles, records a graph) was seen and not counted
    rounds: int = 0  # rounds since the last probe
    next_probe: float = 0.0  # clock time from which the other count may be probed


class ThreadGovernor:
    """Picks 1 or `threads` threads per round of a shape (any hashable key: rounds of one
    shape take about the same time) from the measured seconds of earlier rounds.

    choose(key) -> the count for the next round; record(key, count, seconds) after it.
    Mutates only its own per-shape estimates. With threads <= 1 it always says threads."""

    def __init__(self, threads: int, clock: Callable[[], float]):
        self.threads = threads
        self.clock = clock
        self.start = threads  # the count a new shape starts on (1 while the machine looks busy)
        self._shapes: dict[Hashable, _Shape] = {}

    def choose(self, key: Hashable) -> int:
        """The thread count for the next round of shape `key`: the faster estimate, or the
        other one when a probe is due (after MIN_PROBE_ROUNDS rounds and the shape's gap)."""
        if self.threads <= 1:
            return self.threads
        s = self._shape(key)
        if s.seconds and s.rounds >= MIN_PROBE_ROUNDS and self.clock() >= s.next_probe:
            return self._other(s.current)
        return s.current

    def record(self, key: Hashable, threads: int, seconds: float) -> None:
        """A round of shape `key` took `seconds` on `threads` threads (as choose said)."""
        if self.threads <= 1:
            return
        s = self._shape(key)
        if not s.warm:  # compiles, records a graph: not counted
            s.warm = True
            return
        if threads == s.current:
            old = s.seconds.get(threads)
            s.seconds[threads] = seconds if old is None else old + EMA * (seconds - old)
            s.rounds += 1
        else:  # a probe: its estimate was old, this round replaces it
            s.seconds[threads] = seconds
            extra = max(0.0, seconds - s.seconds.get(s.current, seconds))
            s.next_probe = self.clock() + min(MAX_PROBE_GAP_S, max(MIN_PROBE_GAP_S, extra / PROBE_SHARE))
            s.rounds = 0
        if len(s.seconds) < 2:
            return
        team, one = s.seconds[self.threads], s.seconds[1]
        if team > BUSY_RATIO * one:
            self.start = 1
        elif team < one:
            self.start = self.threads
        faster = self.threads if team <= one else 1
        if faster != s.current:
            if threads == s.current:  # slower than the other's last probe: switch, and probe back soon
                s.next_probe = self.clock() + MIN_PROBE_GAP_S
                s.rounds = 0
            s.current = faster

    def _shape(self, key: Hashable) -> _Shape:
        s = self._shapes.get(key)
        if s is None:
            s = self._shapes[key] = _Shape(current=self.start)
        return s

    def _other(self, count: int) -> int:
        return 1 if count == self.threads else self.threads
