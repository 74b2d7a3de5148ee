"""What every gateway route shares: the engine client (None while loading) and settings."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from zinfer.gateway.client import EngineClient
from zinfer.gateway.metrics import Metrics
from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.origins import OriginPolicy
from zinfer.models.sampling_defaults import SamplingDefaults


@dataclass
class GatewayState:
    model_name: str
    api_key: str | None = None
    origins: OriginPolicy = field(default_factory=OriginPolicy)  # Host, Origin and CORS rules
    client: EngineClient | None = None  # set once the engine is ready
    max_model_len: int = 0
    max_waiting: int = 0  # sequences the engine queues at once (--max-waiting): more is a 400; 0: unchecked
    model_aliases: set[str] = field(default_factory=set)  # other names a request may use (path, --served-model-name)
    system_fingerprint: str = ""  # in every completion response and chunk: see fingerprint()
    max_body_bytes: int = 4 << 20  # larger request bodies get 413
    metrics: Metrics = field(default_factory=Metrics)
    token_text: dict[int, str] = field(default_factory=dict)  # token id -> its text, for logprobs
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)  # what a request's unset sampling fields get
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.client is not None

    def engine(self) -> EngineClient:
        """The engine's client; ApiError 503 while the model loads."""
        if self.client is None:
            raise ApiError(503, "the model is loading", type="unavailable_error", code="loading")
        return self.client

    def serves(self, model: str | None) -> bool:
        """Whether a request naming this model is for us (no model: yes)."""
        return model is None or model == self.model_name or model in self.model_aliases


def fingerprint(model_path: str, device: str) -> str:
    """OpenAI's system_fingerprint for one server: zinfer's version and a hash of the model
    file and device, e.g. "zinfer-0.1.0-3f2a9c1e"; the same for every response it sends."""
    digest = hashlib.sha256(f"{model_path}\n{device}".encode()).hexdigest()[:8]
    return f"zinfer-{version('zinfer')}-{digest}"
