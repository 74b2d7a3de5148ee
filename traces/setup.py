"""OpenTelemetry set-up: one Tracing per traced process, and the few calls actors make.

`open_tracing` returns None when tracing is off, and instrumented code tests for None
before touching anything here: with tracing off no span object is ever built.

Two ways to make a span: `start` builds an OpenTelemetry span (for spans that stay
open: request, tokenize, queue); `record` writes a span whose start and end are
already known (the per-round spans: schedule, round, sample, kv_update) straight to
the part file with no SDK object (a quarter of the cost: BENCHMARKS.md, traces/setup.py),
unless spans also go to OTLP.

Spans go to this process's part file (traces/parts.py) as they end, and to an OTLP
collector when an endpoint is configured (the exporter package is an optional extra,
imported only then; without it tracing goes on to files and says so once).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any, Iterable, Sequence

import structlog
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span
from opentelemetry.util.types import AttributeValue

from zinfer.traces.config import TraceConfig
from zinfer.traces.context import format_traceparent, parent_context, parse_traceparent, traceparent_ids
from zinfer.traces.kernels import KernelClock, KernelRecorder, TimedEvent
from zinfer.traces.parts import PartSpanProcessor, PartWriter

log = structlog.get_logger("zinfer.traces")


class Tracing:
    """A process's tracer, its resource (model, device, role, pid) and its outputs."""

    def __init__(self, config: TraceConfig, role: str, resource: dict[str, Any] | None = None):
        config.validate()
        self.config, self.role = config, role
        attrs: dict[str, AttributeValue] = {"service.name": "zinfer", "zinfer.role": role, "process.pid": os.getpid()}
        attrs.update({k: v for k, v in (resource or {}).items() if v is not None})
        self.provider = TracerProvider(resource=Resource.create(attrs), shutdown_on_exit=False)
        self.writer = PartWriter(config.dir, role, config.window_s) if config.dir else None
        if self.writer is not None:
            self.provider.add_span_processor(PartSpanProcessor(self.writer))
        if config.otlp_endpoint:
            _add_otlp(self.provider, config.otlp_endpoint)
        self.tracer = self.provider.get_tracer("zinfer")
        self._direct = self.writer is not None and not config.otlp_endpoint  # record() writes files itself

    def start(
        self,
        name: str,
        parent: Span | str | None = None,
        attributes: dict[str, Any] | None = None,
        links: Iterable[str] = (),
        start_ns: int | None = None,
    ) -> Span:
        """Start a span under parent (a Span, a traceparent string, or None for a new
        trace), linked to the spans named by `links` (traceparent strings). End it with
        span.end() (or span.end(end_time=ns))."""
        link_objs = [Link(sc) for sc in map(parse_traceparent, links) if sc is not None]
        return self.tracer.start_span(name, parent_context(parent), attributes=attributes, links=link_objs,
                                      start_time=start_ns if start_ns is not None else time.time_ns())

    def record(
        self,
        name: str,
        parent: str | None,
        attributes: dict[str, Any],
        links: Sequence[str] = (),
        start_ns: int | None = None,
        end_ns: int | None = None,
        kernels: tuple[int, list[TimedEvent]] | None = None,
    ) -> None:
        """A finished span from start_ns to end_ns (epoch ns; None: now) under parent (a
        traceparent string or None), linked to `links`; what start(...).end() makes, as
        cheaply as the outputs allow. kernels: (offset, events) of a round, stored under
        the span as write_kernels does."""
        w = self.writer
        if w is None or not self._direct:
            span = self.start(name, parent, attributes, links, start_ns)
            span.end(end_time=end_ns)
            if kernels is not None:
                self.write_kernels(span, *kernels)
            return
        now = time.time_ns()
        ids = traceparent_ids(parent)
        if ids is not None and not ids[2]:
            return  # an unsampled parent: the SDK would not record the span either
        trace = ids[0] if ids else f"{random.getrandbits(128) or 1:032x}"
        span_id = f"{random.getrandbits(64) or 1:016x}"
        link_ids = [link[:2] for link in map(traceparent_ids, links) if link is not None]
        start, end = (now if start_ns is None else start_ns), (now if end_ns is None else end_ns)
        records = [w.span_record(name, trace, span_id, ids[1] if ids else None, start, end, attributes, link_ids)]
        if kernels is not None and kernels[1]:
            records.append(w.kernels_record(trace, span_id, *kernels))
        w.write(*records)

    @staticmethod
    def traceparent(span: Span) -> str:
        """The traceparent that makes a remote span a child of `span`."""
        return format_traceparent(span.get_span_context())

    def kernel_recorder(self, clock: KernelClock | None = None) -> KernelRecorder | None:
        """A recorder for one executor's rounds, or None when kernels are not traced."""
        return KernelRecorder(clock) if self.config.kernels else None

    def write_kernels(self, round_span: Span, offset: int, events: list[TimedEvent]) -> None:
        """Store a round's layer and kernel events under its span (files only: OTLP gets
        the spans down to the round)."""
        if self.writer is None or not events:
            return
        ctx = round_span.get_span_context()
        self.writer.write(self.writer.kernels_record(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", offset, events))

    def close(self) -> None:
        """Flush and close every output (OTLP included); the object is unusable after."""
        self.provider.shutdown()


def open_tracing(config: TraceConfig, role: str, resource: dict[str, Any] | None = None) -> Tracing | None:
    """The process's Tracing for `role` (an actor name, or "engine" for all in one
    process), or None when the config turns tracing off."""
    return Tracing(config, role, resource) if config.enabled else None


def _add_otlp(provider: TracerProvider, endpoint: str) -> None:
    try:  # the otlp extra (typed): mypy finds no module where it is not installed
        from opentelemetry.exporter.otlp.proto.http import (  # type: ignore[import-not-found, unused-ignore]
            trace_exporter,
        )
    except ImportError:
        log.warning("otlp export skipped: pip install opentelemetry-exporter-otlp-proto-http", endpoint=endpoint)
        return
    provider.add_span_processor(BatchSpanProcessor(trace_exporter.OTLPSpanExporter(endpoint=endpoint)))
