"""W3C traceparent strings <-> OpenTelemetry span contexts, without the propagator API.

The engine's messages carry `traceparent` strings ("00-<trace id>-<span id>-<flags>"),
so one trace crosses actors and processes.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags


def format_traceparent(ctx: SpanContext) -> str:
    """The traceparent header value naming this span as the parent."""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _fields(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a traceparent, or None if it is absent or malformed."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, flags


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The remote span context in a traceparent, or None if it is absent or malformed."""
    f = _fields(value)
    return SpanContext(f[0], f[1], is_remote=True, trace_flags=TraceFlags(f[2])) if f else None


def traceparent_ids(value: str | None) -> tuple[str, str, bool] | None:
    """(trace id, span id, sampled) of a traceparent, ids in hex as part files write them;
    None if it is absent or malformed. No OpenTelemetry object is built."""
    f = _fields(value)
    return (f"{f[0]:032x}", f"{f[1]:016x}", bool(f[2] & 1)) if f else None


def parent_context(parent: Span | str | None) -> Context:
    """The OTel Context to start a child in: parent is a Span, a traceparent string or
    None (a new trace; never the ambient context, which the engine does not use)."""
    if parent is None:
        return Context()
    if isinstance(parent, str):
        sc = parse_traceparent(parent)
        return trace.set_span_in_context(NonRecordingSpan(sc), Context()) if sc else Context()
    return trace.set_span_in_context(parent, Context())
