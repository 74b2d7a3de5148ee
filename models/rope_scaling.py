"""RoPE scaling as a model file asks for it, in llama.cpp's terms (kernels/oracle/rope.py
RopeScaling): GGUF's {arch}.rope.scaling.* keys and rope_freqs.weight, or config.json's
rope_scaling. What llama.cpp would not run as asked is refused with a ModelError."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import msgspec
import numpy as np

from zinfer.kernels.oracle.rope import RopeScaling, scaling_as_llama_cpp
from zinfer.models.spec import ModelError

# {arch}.rope.scaling.* keys llama.cpp reads for these architectures, and those it ignores
# (read only for grok, mistral3, deepseek2, ...): accepted only at the value llama.cpp
# runs with, so a file that asks for something else is refused, not run differently.
_GGUF_SCALING_READ = ("type", "factor", "original_context_length", "attn_factor", "finetuned")
_GGUF_SCALING_FIXED = {"yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_log_multiplier": 0.0}
_GGUF_SCALING_KEYS = _GGUF_SCALING_READ + tuple(_GGUF_SCALING_FIXED) + ("yarn_ext_factor",)
_ROPE_FREQS_ARCHS = ("llama", "mistral")  # llama.cpp loads rope_freqs.weight for these only
_REFUSE_TO_PICK = "zinfer refuses rather than pick one"


def gguf_rope_scaling(meta: Mapping[str, Any], arch: str, rope_dim: int, context_length: int,
                      tensors: Mapping[str, Any]) -> RopeScaling | None:
    """The RoPE scaling llama.cpp runs for a GGUF file (llama-model.cpp load_hparams), or None
    for plain RoPE. Raises ModelError naming the key or tensor of anything else."""
    prefix = f"{arch}.rope.scaling."

    def refuse(key: str, why: str) -> ModelError:
        return ModelError(f"GGUF {key} = {meta.get(key)!r}: {why}")

    for key in meta:
        if key.startswith(prefix) and key[len(prefix):] not in _GGUF_SCALING_KEYS:
            raise refuse(key, "RoPE scaling key zinfer does not implement")
    for key in (f"{arch}.rope.dimension_sections", f"{arch}.rope.dimension_count_swa"):
        if key in meta:
            raise refuse(key, "multi-section / per-window RoPE is not supported")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in tensors:
            raise ModelError(f"GGUF tensor {name!r}: LongRoPE frequency factors are not supported")
    kind = str(meta.get(prefix + "type", "linear"))  # llama.cpp's default when the key is absent
    if kind == "longrope":
        raise refuse(prefix + "type", "LongRoPE scaling is not supported")
    if kind not in ("none", "linear", "yarn"):
        raise refuse(prefix + "type", "unknown RoPE scaling type (supported: none, linear, yarn)")
    factor_key = prefix + "factor" if prefix + "factor" in meta else f"{arch}.rope.scale_linear"
    factor = _number(meta, factor_key, 0.0, refuse, minimum=0.0)
    for name, value in _GGUF_SCALING_FIXED.items():
        if prefix + name in meta and _number(meta, prefix + name, value, refuse) != value:
            raise refuse(prefix + name, f"llama.cpp runs {arch} with {value} whatever the file says; {_REFUSE_TO_PICK}")
    ext_key = prefix + "yarn_ext_factor"
    if ext_key in meta and _number(meta, ext_key, 0.0, refuse) != (1.0 if kind == "yarn" else 0.0):
        raise refuse(ext_key, f"llama.cpp ignores it for {arch}; {_REFUSE_TO_PICK}")
    original = int(_number(meta, prefix + "original_context_length", context_length, refuse, minimum=1))
    attn_factor = _number(meta, prefix + "attn_factor", 1.0, refuse, minimum=1e-6)
    freq_factors = _rope_freqs(tensors, arch, rope_dim)
    scaling = scaling_as_llama_cpp(kind, factor, original, attn_factor, freq_factors)
    return None if scaling.is_identity else scaling


def _number(meta: Mapping[str, Any], key: str, default: float, refuse: Callable[[str, str], ModelError],
            minimum: float | None = None) -> float:
    """meta[key] as a finite float (default when absent); raises refuse(key, why) otherwise."""
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise refuse(key, "not a finite number")
    if minimum is not None and value < minimum:
        raise refuse(key, f"must be at least {minimum}")
    return float(value)


def _rope_freqs(tensors: Mapping[str, Any], arch: str, rope_dim: int) -> tuple[float, ...]:
    """rope_freqs.weight [rope_dim/2] (Llama 3's per-pair divisors of theta), () when absent."""
    t = tensors.get("rope_freqs.weight")
    if t is None:
        return ()
    if arch not in _ROPE_FREQS_ARCHS:
        raise ModelError(f"GGUF tensor 'rope_freqs.weight' in a {arch} model: llama.cpp does not use it there")
    if getattr(t.qtype, "name", "") != "F32" or tuple(t.shape) != (rope_dim // 2,):
        raise ModelError(f"GGUF tensor 'rope_freqs.weight' must be F32 of shape ({rope_dim // 2},), "
                         f"got {t.qtype.name} {tuple(t.shape)}")
    values = np.asarray(t.data, np.float32).reshape(-1)
    if not np.all(np.isfinite(values)) or not np.all(values > 0):
        raise ModelError("GGUF tensor 'rope_freqs.weight' holds values that are not positive finite numbers")
    return tuple(float(v) for v in values)


def swa_scaling(scaling: RopeScaling | None) -> RopeScaling | None:
    """Gemma 3's sliding layers: llama.cpp gives them freq_scale 1 (rope_freq_scale_train_swa)
    but the same YaRN mix and magnitude."""
    if scaling is None:
        return None
    swa = msgspec.structs.replace(scaling, freq_scale=1.0)
    return None if swa.is_identity else swa


def llama3_freq_factors(base: float, rope_dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                        original: int) -> tuple[float, ...]:
    """HF's "llama3" rope_scaling as llama.cpp's converter turns it into rope_freqs.weight:
    1 for short wavelengths, `factor` for long ones, a smooth blend between (float32)."""
    exponents = np.arange(0, rope_dim, 2, dtype=np.float32) / np.float32(rope_dim)  # [rope_dim/2]
    freqs = (np.float32(1) / np.float32(base) ** exponents).astype(np.float32)
    wavelen = np.float32(2 * math.pi) / freqs
    low_wavelen, high_wavelen = np.float32(original / low_freq_factor), np.float32(original / high_freq_factor)
    span = np.float32(high_freq_factor - low_freq_factor)
    smooth = (np.float32(original) / wavelen - np.float32(low_freq_factor)) / span
    blend = np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth)
    out = np.where(wavelen < high_wavelen, np.float32(1), np.where(wavelen > low_wavelen, np.float32(factor), blend))
    return tuple(float(v) for v in out.astype(np.float32))


# config.json rope_scaling keys each type may carry, with the value llama.cpp (which
# ignores them for these architectures) runs; anything else is refused.
_HF_FIXED = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "extrapolation_factor": 1.0}
_HF_KEYS = {
    "linear": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def hf_rope_scaling(config: Mapping[str, Any], arch: str, rope_theta: float, rope_dim: int,
                    context_length: int) -> RopeScaling | None:
    """config.json's rope_scaling in llama.cpp's terms (HF semantics, as llama.cpp's
    converter writes it into a GGUF file), or None for plain RoPE; ModelError otherwise."""
    params = config.get("rope_scaling")
    if params is None:
        params = {k: v for k, v in (config.get("rope_parameters") or {}).items() if k != "rope_theta"}
    if not params:
        return None

    def refuse(why: str) -> ModelError:
        return ModelError(f"config.json rope_scaling {dict(params)!r}: {why}")

    if not isinstance(params, Mapping):
        raise refuse("not an object")
    kind = params.get("rope_type", params.get("type"))
    if kind in (None, "default") and not set(params) - {"rope_type", "type"}:
        return None
    if kind not in _HF_KEYS:
        raise refuse(f"unsupported rope_type {kind!r} (supported: default, linear, yarn, llama3)")
    for key, value in params.items():
        if key in ("rope_type", "type") or key in _HF_KEYS[kind]:
            continue
        if kind == "yarn" and key in _HF_FIXED and value == _HF_FIXED[key]:
            continue
        raise refuse(f"key {key!r} = {value!r} is not supported with rope_type {kind!r}")

    def number(key: str, default: float | None = None) -> float:
        value = params.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise refuse(f"{key!r} must be a positive number")
        return float(value)

    factor = number("factor")
    if kind == "linear":
        scaling = scaling_as_llama_cpp("linear", factor, 0)
    elif kind == "yarn":
        scaling = scaling_as_llama_cpp("yarn", factor, int(number("original_max_position_embeddings", context_length)))
    else:
        if arch not in _ROPE_FREQS_ARCHS:
            raise refuse(f"llama3 scaling on a {arch} model (llama.cpp applies it to llama only)")
        low, high = number("low_freq_factor", 1.0), number("high_freq_factor", 4.0)
        if low >= high:
            raise refuse("low_freq_factor must be below high_freq_factor")
        original = int(number("original_max_position_embeddings", 8192))
        ff = llama3_freq_factors(rope_theta, rope_dim, factor, low, high, original)
        scaling = scaling_as_llama_cpp("linear", 0.0, 0, freq_factors=ff)
    return None if scaling.is_identity else scaling
