"""OpenTelemetry set-up: one Tracing per traced process, and the few calls actors make.

`open_tracing` returns None when tracing is off, and instrumented code tests for None
before touching anything here: with tracing off no span object is ever built.

Spans go to this process's part file (traces/parts.py) as they end, and to an OTLP
collector when an endpoint is configured (the exporter package is an optional extra,
imported only then; without it tracing goes on to files and says so once).
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable

import structlog
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, Span

from zinfer.traces.config import TraceConfig
from zinfer.traces.context import format_traceparent, parent_context, parse_traceparent
from zinfer.traces.kernels import KernelRecorder
from zinfer.traces.parts import PartSpanProcessor, PartWriter

log = structlog.get_logger("zinfer.traces")


class Tracing:
    """A process's tracer, its resource (model, device, role, pid) and its outputs."""

    def __init__(self, config: TraceConfig, role: str, resource: dict[str, Any] | None = None):
        config.validate()
        self.config, self.role = config, role
        attrs = {"service.name": "zinfer", "zinfer.role": role, "process.pid": os.getpid()}
        attrs.update({k: v for k, v in (resource or {}).items() if v is not None})
        self.provider = TracerProvider(resource=Resource.create(attrs), shutdown_on_exit=False)
        self.writer = PartWriter(config.dir, role, config.window_s) if config.dir else None
        if self.writer is not None:
            self.provider.add_span_processor(PartSpanProcessor(self.writer))
        if config.otlp_endpoint:
            _add_otlp(self.provider, config.otlp_endpoint)
        self.tracer = self.provider.get_tracer("zinfer")

    def start(self, name: str, parent: Span | str | None = None, attributes: dict | None = None,
              links: Iterable[str] = (), start_ns: int | None = None) -> Span:
        """Start a span under parent (a Span, a traceparent string, or None for a new
        trace), linked to the spans named by `links` (traceparent strings). End it with
        span.end() (or span.end(end_time=ns))."""
        link_objs = [Link(sc) for sc in map(parse_traceparent, links) if sc is not None]
        return self.tracer.start_span(name, parent_context(parent), attributes=attributes, links=link_objs,
                                      start_time=start_ns if start_ns is not None else time.time_ns())

    @staticmethod
    def traceparent(span: Span) -> str:
        """The traceparent that makes a remote span a child of `span`."""
        return format_traceparent(span.get_span_context())

    def kernel_recorder(self, clock: Any = None) -> KernelRecorder | None:
        """A recorder for one executor's rounds, or None when kernels are not traced."""
        return KernelRecorder(clock) if self.config.kernels else None

    def write_kernels(self, round_span: Span, offset: int, events: list) -> None:
        """Store a round's layer and kernel events under its span (files only: OTLP gets
        the spans down to the round)."""
        if self.writer is None or not events:
            return
        ctx = round_span.get_span_context()
        self.writer.write({"k": "kernels", "trace": f"{ctx.trace_id:032x}", "parent": f"{ctx.span_id:016x}",
                           "pid": self.writer.pid, "role": self.role, "offset": offset, "events": events})

    def close(self) -> None:
        """Flush and close every output (OTLP included); the object is unusable after."""
        self.provider.shutdown()


def open_tracing(config: TraceConfig, role: str, resource: dict[str, Any] | None = None) -> Tracing | None:
    """The process's Tracing for `role` (an actor name, or "engine" for all in one
    process), or None when the config turns tracing off."""
    return Tracing(config, role, resource) if config.enabled else None


def _add_otlp(provider: TracerProvider, endpoint: str) -> None:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning("otlp export skipped: pip install opentelemetry-exporter-otlp-proto-http", endpoint=endpoint)
        return
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
