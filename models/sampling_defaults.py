"""The sampling a model's authors recommend, where its files say: GGUF's general.sampling.*
keys (llama.cpp writes them from a model's generation config) or an HF directory's
generation_config.json. The server fills a request's unset fields from these, else from
OpenAI's defaults, and says which in /v1/models (as vLLM applies generation_config.json)."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import structlog

log = structlog.get_logger("zinfer.models")

GGUF_KEYS = {
    "temperature": "general.sampling.temp",
    "top_p": "general.sampling.top_p",
    "top_k": "general.sampling.top_k",
    "min_p": "general.sampling.min_p",
    "repetition_penalty": "general.sampling.penalty_repeat",
}
HF_KEYS = {field: field for field in GGUF_KEYS}  # generation_config.json names them as the fields
RANGES = {
    "temperature": (0.0, 100.0),
    "top_p": (1e-9, 1.0),
    "top_k": (0, 2**31 - 1),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.01, 100.0),
}


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that leaves a field unset gets; source: "openai" (OpenAI's defaults) or
    "model" (at least one field from the model's files)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    source: str = "openai"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sampling_defaults(source: Any) -> SamplingDefaults:
    """The defaults of a models.loader.ModelSource: its files' values where valid (a value out
    of range is logged and left out), OpenAI's for the rest."""
    if source.format == "gguf":
        raw = {field: source.gguf_metadata.get(key) for field, key in GGUF_KEYS.items()}
    else:
        raw = {field: _generation_config(Path(source.path)).get(key) for field, key in HF_KEYS.items()}
    found = {k: v for k, v in raw.items() if v is not None and _valid(k, v)}
    for k in set(raw) - set(found):
        if raw[k] is not None:
            log.warning("sampling default ignored", field=k, value=repr(raw[k])[:40], model=str(source.path))
    if not found:
        return SamplingDefaults()
    values: dict[str, Any] = {k: int(v) if k == "top_k" else float(v) for k, v in found.items()}  # field -> value
    return SamplingDefaults(**values, source="model")


def _generation_config(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) and data.get("do_sample", True) is not False else {}


def _valid(field: str, value: Any) -> bool:
    lo, hi = RANGES[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if field == "top_k" else numbers.Real):
        return False
    return math.isfinite(float(value)) and lo <= float(value) <= hi
