"""Gateway metrics in Prometheus text format: request outcomes, tokens, latencies, engine state.

Every POST to a generation endpoint that passes authentication is counted exactly once
in zinfer_requests_total, by how it ended: finished, cancelled (the client left or the
request was cancelled), rejected (refused: bad input, unknown model, too long, queue
full) or failed (the engine could not finish it). Queue depth, running sequences and KV
usage are read from the engine when /metrics is scraped.
"""

from __future__ import annotations

import bisect
import time
from typing import AsyncGenerator, Callable

from zinfer.messages.client import Cancelled, ClientEvent, Delta, EngineStats, Failed, Finished, Rejected, Started

OUTCOMES = ("finished", "cancelled", "rejected", "failed")
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Cumulative-bucket histogram as Prometheus exposes it."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last: +Inf only
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    """Counters and histograms of one gateway; mutated by RequestRecords."""

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.in_flight = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        # with replicas (gateway/router.py): by replica name, its last stats (None while it is down)
        # and the requests the router has sent it (moved ones count on each replica that had them)
        self.replicas: Callable[[], dict[str, tuple[EngineStats | None, int]]] | None = None

    def open(self) -> "RequestRecord":
        """Start accounting for one generation request (arrived now)."""
        return RequestRecord(self)

    def render(self, stats: EngineStats | None) -> str:
        """The Prometheus text exposition; engine gauges are left out when stats is None."""
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, lines: list[str]) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *lines])

        def counter(name: str, help_: str, value: int) -> None:
            metric(name, "counter", help_, [f"{name} {value}"])

        outcomes = [f'zinfer_requests_total{{outcome="{k}"}} {v}' for k, v in self.outcomes.items()]
        metric("zinfer_requests_total", "counter", "Generation requests by how they ended.", outcomes)
        metric("zinfer_requests_in_flight", "gauge", "Generation requests the gateway is serving now.",
               [f"zinfer_requests_in_flight {self.in_flight}"])
        counter("zinfer_prompt_tokens_total", "Prompt tokens of admitted requests.", self.prompt_tokens)
        counter("zinfer_generation_tokens_total", "Tokens generated and sent to clients.", self.generation_tokens)
        ttft, itl = "zinfer_time_to_first_token_seconds", "zinfer_inter_token_latency_seconds"
        metric(ttft, "histogram", "From request arrival to its first token.", self.ttft.lines(ttft))
        metric(itl, "histogram", "Between successive tokens of one request.", self.itl.lines(itl))
        if stats is not None:
            usage = round(stats.kv_used_blocks / stats.kv_blocks, 6) if stats.kv_blocks else 0.0
            gauges: list[tuple[str, str, float]] = [
                ("zinfer_queue_depth", "Sequences waiting for admission.", stats.waiting),
                ("zinfer_running_sequences", "Sequences running in rounds.", stats.running),
                ("zinfer_kv_blocks", "KV cache blocks in the pool.", stats.kv_blocks),
                ("zinfer_kv_used_blocks", "KV blocks held by sequences.", stats.kv_used_blocks),
                ("zinfer_kv_cached_blocks", "Free KV blocks kept for prefix caching.", stats.kv_cached_blocks),
                ("zinfer_kv_usage_ratio", "Fraction of KV blocks held by sequences.", usage),
                ("zinfer_engine_open_requests", "Requests open in the engine.", stats.open_requests),
            ]
            for name, help_, value in gauges:
                metric(name, "gauge", help_, [f"{name} {value}"])
            counter("zinfer_spec_drafted_tokens_total", "Speculative tokens drafted.", stats.drafted_tokens)
            counter("zinfer_spec_accepted_tokens_total", "Speculative tokens verification kept.", stats.accepted_tokens)
            rate = round(stats.accepted_tokens / stats.drafted_tokens, 6) if stats.drafted_tokens else 0.0
            metric("zinfer_spec_acceptance_ratio", "gauge", "Accepted over drafted speculative tokens.",
                   [f"zinfer_spec_acceptance_ratio {rate}"])
        if self.replicas is not None:
            out.extend(replica_lines(self.replicas()))
        return "\n".join(out) + "\n"


REPLICA_GAUGES = (
    ("zinfer_replica_up", "Whether the replica takes requests (1) or is down (0).", "up"),
    ("zinfer_replica_queue_depth", "Sequences waiting for admission on the replica.", "waiting"),
    ("zinfer_replica_running_sequences", "Sequences running in the replica's rounds.", "running"),
    ("zinfer_replica_kv_blocks", "KV cache blocks in the replica's pool.", "kv_blocks"),
    ("zinfer_replica_kv_used_blocks", "KV blocks held by the replica's sequences.", "kv_used_blocks"),
    ("zinfer_replica_kv_cached_blocks", "Free KV blocks the replica keeps for prefix caching.", "kv_cached_blocks"),
    ("zinfer_replica_open_requests", "Requests open in the replica's engine.", "open_requests"),
)


def replica_lines(replicas: dict[str, tuple[EngineStats | None, int]]) -> list[str]:
    """Per-replica counters and gauges labelled replica="name": the requests routed to it, and
    its last stats (a replica that is down shows zinfer_replica_up 0 and no other gauge)."""
    name = "zinfer_replica_requests_total"
    out = [f"# HELP {name} Requests the router sent the replica.", f"# TYPE {name} counter"]
    out += [f'{name}{{replica="{replica}"}} {routed}' for replica, (_, routed) in sorted(replicas.items())]
    for name, help_, attr in REPLICA_GAUGES:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for replica, (stats, _) in sorted(replicas.items()):
            if attr == "up":
                out.append(f'{name}{{replica="{replica}"}} {int(stats is not None)}')
            elif stats is not None:
                out.append(f'{name}{{replica="{replica}"}} {getattr(stats, attr)}')
    return out


class RequestRecord:
    """The accounting of one generation request: its outcome is set once, by the first end."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self.t0 = time.perf_counter()
        self.last_token: float | None = None
        self.outcome: str | None = None
        metrics.in_flight += 1

    def finish(self, outcome: str) -> None:
        """Record how the request ended; later calls change nothing."""
        if self.outcome is None:
            self.outcome = outcome
            self.metrics.outcomes[outcome] += 1
            self.metrics.in_flight -= 1

    def close(self) -> None:
        """The gateway is done with the request: one that never ended was cancelled."""
        self.finish("cancelled")

    async def observe(self, events: AsyncGenerator[ClientEvent, None]) -> AsyncGenerator[ClientEvent, None]:
        """Pass events through, recording tokens, latencies and the terminal outcome.

        Closing this generator closes `events` (so an engine stream cancels its request).
        """
        try:
            async for event in events:
                self._see(event)
                yield event
        finally:
            await events.aclose()

    def _see(self, event: ClientEvent) -> None:
        if isinstance(event, Delta) and event.token_ids:
            now = time.perf_counter()
            if self.last_token is None:
                self.metrics.ttft.observe(now - self.t0)
            else:
                self.metrics.itl.observe(now - self.last_token)
            self.last_token = now
            self.metrics.generation_tokens += len(event.token_ids)
        elif isinstance(event, Started):
            self.metrics.prompt_tokens += event.prompt_tokens
        elif isinstance(event, Finished):
            self.finish("finished")
        elif isinstance(event, Cancelled):
            self.finish("cancelled")
        elif isinstance(event, Rejected):
            self.finish("rejected")
        elif isinstance(event, Failed):
            self.finish("failed")
