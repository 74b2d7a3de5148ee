"""What every gateway route shares: the engine client (None while loading) and settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zinfer.gateway.client import AsyncClient


@dataclass
class GatewayState:
    model_name: str
    api_key: str | None = None
    client: AsyncClient | None = None  # set once the engine is ready
    max_model_len: int = 0
    metrics: Any = None  # gateway.metrics.Metrics, when that module is in use
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.client is not None
