"""TraceConfig: what the engine traces and where the spans go; validated at start-up.

Tracing is off unless `dir` or `otlp_endpoint` is set; off means no span object and
no kernel timer is ever built. Every process of a topology gets the same config (it
rides inside EngineConfig), writes its own part files into `dir`, and the parent
merges them into one Perfetto-loadable trace (traces/merge.py).
"""

from __future__ import annotations

import msgspec

# Span names: the vocabulary shared by the instrumented actors and the exporters.
REQUEST, TOKENIZE, QUEUE, SCHEDULE = "request", "tokenize", "queue", "schedule"
REQUEST_SCOPED = (REQUEST, TOKENIZE, QUEUE)  # drawn on their request's track


class TraceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dir: str = ""  # each process appends its spans to part files here ("" = no files)
    kernels: bool = True  # time every device op (cheap recorder) under layer slices
    otlp_endpoint: str = ""  # also export spans over OTLP/HTTP, e.g. http://localhost:4318/v1/traces
    window_s: float = 0.0  # > 0: part files roll over every window_s seconds (zinfer serve)

    @property
    def enabled(self) -> bool:
        return bool(self.dir or self.otlp_endpoint)

    def validate(self) -> None:
        if self.window_s < 0:
            raise ValueError("trace window_s must be >= 0")
        if self.otlp_endpoint and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise ValueError(f"otlp endpoint {self.otlp_endpoint!r} must be an http(s):// URL")
