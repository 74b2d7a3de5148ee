"""zinfer.traces: OpenTelemetry and structlog set-up, span helpers, the part files and the
Perfetto exporter.

May import: no other zinfer folder. Only actors and gateway import it (a device is traced
from above, by the executor).
"""
