"""Hyperparameters a model file may claim, bounded: a corrupt or hostile header (a block
count of 2^32, zero heads, a head size of -1, a string where a count belongs) is refused
with a ModelError naming the value, never a hang, a ZeroDivisionError or a kernel reading
past its arrays."""

from __future__ import annotations

import math
from typing import Any, Callable

from zinfer.models.spec import ModelError, ModelSpec

MAX_LAYERS = 1024
# ModelSpec field -> the largest value any supported model comes near (times a margin)
LIMITS = {
    "n_layers": MAX_LAYERS,
    "d_model": 1 << 16,
    "n_heads": 1024,
    "n_kv_heads": 1024,
    "head_dim": 1024,
    "d_ff": 1 << 18,
    "vocab_size": 1 << 22,
    "context_length": 1 << 24,
}


def check_layers(key: str, n_layers: int) -> int:
    """n_layers, if 1..MAX_LAYERS: read before anything is built per layer."""
    if not 1 <= n_layers <= MAX_LAYERS:
        raise ModelError(f"{key} = {n_layers} is out of range (1 to {MAX_LAYERS})")
    return n_layers


def checked(source: str, build: Callable[[], ModelSpec]) -> ModelSpec:
    """build()'s spec, checked; a value it could not use (TypeError, ZeroDivisionError...)
    or one out of range raises ModelError naming `source` ("GGUF metadata", "config.json")."""
    try:
        spec = build()
    except ModelError:
        raise
    except (TypeError, ValueError, ArithmeticError, KeyError, AttributeError, IndexError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ModelError(f"{source}: a hyperparameter holds a value zinfer cannot use ({why})") from None
    return check_spec(source, spec)


def check_spec(source: str, spec: ModelSpec) -> ModelSpec:
    """spec, if its shapes and numerics are ones a forward can run; else ModelError."""
    for field, hi in LIMITS.items():
        value = getattr(spec, field)
        if not 1 <= value <= hi:
            raise ModelError(f"{source}: {field} = {value} is out of range (1 to {hi})")
    bad = _first_bad(spec)
    if bad:
        raise ModelError(f"{source}: {bad}")
    return spec


def _first_bad(s: ModelSpec) -> str | None:
    floats: dict[str, Any] = {
        "rms_eps": s.rms_eps,
        "rope_base": s.rope_base,
        "rope_base_swa": s.rope_base_swa,
        "embed_scale": s.embed_scale,
    }
    for name, value in floats.items():
        if not (math.isfinite(value) and value >= 0):
            return f"{name} = {value} is not a finite number >= 0"
    if s.n_heads % s.n_kv_heads:
        return f"n_heads = {s.n_heads} is not a multiple of n_kv_heads = {s.n_kv_heads}"
    if not 0 <= s.rope_dim <= s.head_dim or s.rope_dim % 2:
        return f"rope_dim = {s.rope_dim} is not an even number up to head_dim = {s.head_dim}"
    if s.sliding_window < 0:
        return f"sliding_window = {s.sliding_window} is negative"
    if s.swa_layers and len(s.swa_layers) != s.n_layers:
        return f"the sliding-window layer pattern covers {len(s.swa_layers)} of {s.n_layers} layers"
    return None
