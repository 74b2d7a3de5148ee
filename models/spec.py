"""ModelSpec: everything the forward pass needs to know about an architecture.

One spec is built from either source: GGUF metadata (`{arch}.block_count`, ...) or a
HuggingFace config.json. The forward reads only the spec, never the source format.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import msgspec

import numpy as np

from zinfer.kernels.oracle.rope import RopeScaling, scaling_as_llama_cpp

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")


class ModelError(ValueError):
    """A model file or directory that zinfer cannot load; the message names the problem."""


class ModelSpec(msgspec.Struct, frozen=True):
    """Shapes and numerics of one decoder-only transformer.

    rope_interleaved: rotate pairs (x[2i], x[2i+1]) as llama.cpp's "normal" RoPE does on
    GGUF llama weights, whose Q/K rows the converter permuted; otherwise rotate halves
    (x[i], x[i + rope_dim/2]) as HuggingFace and llama.cpp's NEOX mode do.
    swa_layers[i] is True where layer i attends over a sliding window of `sliding_window`
    tokens and uses `rope_base_swa`.
    rope_scaling: linear / YaRN / frequency-factor scaling of the RoPE angles
    (kernels/rope.py), None for plain RoPE; rope_scaling_swa is the sliding layers' (Gemma 3
    scales only its global layers, as llama.cpp and HF do).
    """

    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_interleaved: bool
    attn_scale: float
    act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    attn_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False  # post-attention and post-FFN norms (gemma3)
    embed_scale: float = 1.0
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    rope_base_swa: float = 0.0
    rope_scaling: RopeScaling | None = None
    rope_scaling_swa: RopeScaling | None = None

    def layer_window(self, layer: int) -> int:
        """Sliding window of `layer` in tokens, 0 for full attention."""
        return self.sliding_window if self.swa_layers and self.swa_layers[layer] else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_swa if self.layer_window(layer) else self.rope_base

    def layer_rope_scaling(self, layer: int) -> RopeScaling | None:
        return self.rope_scaling_swa if self.layer_window(layer) else self.rope_scaling


def _gemma3_swa(n_layers: int, pattern: int) -> tuple[bool, ...]:
    """Gemma 3: every `pattern`-th layer is global, the others slide."""
    return tuple((i + 1) % pattern != 0 for i in range(n_layers))


def spec_from_gguf(meta: Mapping[str, Any], rope_interleaved_llama: bool = True, tensors: Mapping[str, Any] | None = None) -> ModelSpec:
    """Build the spec from decoded GGUF metadata (and, for rope_freqs.weight, the file's
    tensors: name -> TensorData); a missing key raises ModelError naming it, as does RoPE
    scaling zinfer does not implement and a value out of range (models/spec_checks.py)."""
    from zinfer.models.spec_checks import checked

    return checked("GGUF metadata", lambda: _spec_from_gguf(meta, rope_interleaved_llama, tensors))


def _spec_from_gguf(meta: Mapping[str, Any], rope_interleaved_llama: bool, tensors: Mapping[str, Any] | None) -> ModelSpec:
    from zinfer.models.spec_checks import check_layers

    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def need(key: str) -> Any:
        full = f"{arch}.{key}"
        if full not in meta:
            raise ModelError(f"GGUF metadata key {full!r} is missing")
        return meta[full]

    n_layers = check_layers(f"{arch}.block_count", int(need("block_count")))
    d_model = int(need("embedding_length"))
    n_heads = int(need("attention.head_count"))
    n_kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", d_model // n_heads))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    if not vocab:
        raise ModelError(f"GGUF metadata key {arch + '.vocab_size'!r} is missing")
    common = dict(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=int(need("feed_forward_length")),
        vocab_size=int(vocab),
        context_length=int(need("context_length")),
        rms_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_dim=int(meta.get(f"{arch}.rope.dimension_count", head_dim)),
        attn_scale=1.0 / math.sqrt(head_dim),
    )
    scaling = gguf_rope_scaling(meta, arch, common["rope_dim"], common["context_length"], tensors or {})
    common["rope_scaling"] = scaling
    if arch in ("llama", "mistral"):
        window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
        return ModelSpec(
            **common,
            rope_interleaved=rope_interleaved_llama,
            sliding_window=window,
            swa_layers=(True,) * n_layers if window else (),
            rope_base_swa=common["rope_base"],
            rope_scaling_swa=scaling,
        )
    if arch in ("qwen2", "qwen3"):
        return ModelSpec(**common, rope_interleaved=False, attn_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    # gemma3: llama.cpp hard-codes a pattern of 6 and a local RoPE base of 10000.
    pattern = int(meta.get("gemma3.attention.sliding_window_pattern", 6))
    return ModelSpec(
        **common,
        rope_interleaved=False,
        act="gelu_tanh",
        qk_norm=True,
        sandwich_norms=True,
        embed_scale=math.sqrt(d_model),
        sliding_window=int(need("attention.sliding_window")),
        swa_layers=_gemma3_swa(n_layers, pattern),
        rope_base_swa=float(meta.get("gemma3.rope.freq_base_swa", 10000.0)),
        rope_scaling_swa=swa_scaling(scaling),
    )


_HF_ARCH = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "gemma3": "gemma3"}


def spec_from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    """Build the spec from a HuggingFace config.json (HF weights rotate halves); a value
    out of range raises ModelError (models/spec_checks.py)."""
    from zinfer.models.spec_checks import checked

    return checked("config.json", lambda: _spec_from_hf_config(config))


def _spec_from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    from zinfer.models.spec_checks import check_layers

    if config.get("model_type") == "gemma3" and "text_config" in config:
        config = {**config["text_config"], "model_type": "gemma3_text"}
    arch = _HF_ARCH.get(config.get("model_type", ""))
    if arch is None:
        raise ModelError(f"unsupported architecture {config.get('model_type')!r} in config.json")

    def need(key: str) -> Any:
        if key not in config:
            raise ModelError(f"config.json key {key!r} is missing")
        return config[key]

    n_heads = int(need("num_attention_heads"))
    d_model = int(need("hidden_size"))
    head_dim = int(config.get("head_dim") or d_model // n_heads)
    n_layers = check_layers("num_hidden_layers", int(need("num_hidden_layers")))
    rope_theta = float(config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)))  # transformers 5 nests it
    rope_dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    context_length = int(config.get("max_position_embeddings", 2048))
    scaling = hf_rope_scaling(config, arch, rope_theta, rope_dim, context_length)
    common = dict(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        d_ff=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        context_length=context_length,
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_base=rope_theta,
        rope_dim=rope_dim,
        rope_interleaved=False,
        rope_scaling=scaling,
    )
    if arch in ("llama", "mistral"):
        window = int(config.get("sliding_window") or 0)
        return ModelSpec(
            **common,
            attn_scale=1.0 / math.sqrt(head_dim),
            attn_bias=bool(config.get("attention_bias", False)),
            sliding_window=window,
            swa_layers=(True,) * n_layers if window else (),
            rope_base_swa=common["rope_base"],
            rope_scaling_swa=scaling,
        )
    if arch in ("qwen2", "qwen3"):
        return ModelSpec(**common, attn_scale=1.0 / math.sqrt(head_dim), attn_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    if "layer_types" in config:
        swa = tuple(t == "sliding_attention" for t in config["layer_types"])
    else:
        swa = _gemma3_swa(n_layers, int(config.get("sliding_window_pattern", 6)))
    return ModelSpec(
        **common,
        attn_scale=float(config.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        act="gelu_tanh",
        qk_norm=True,
        sandwich_norms=True,
        embed_scale=math.sqrt(d_model),
        sliding_window=int(need("sliding_window")),
        swa_layers=swa,
        rope_base_swa=float(config.get("rope_local_base_freq", 10000.0)),
        rope_scaling_swa=swa_scaling(scaling),
    )


# {arch}.rope.scaling.* keys llama.cpp reads for these architectures, and those it ignores
# (read only for grok, mistral3, deepseek2, ...): accepted only at the value llama.cpp
# runs with, so a file that asks for something else is refused, not run differently.
_GGUF_SCALING_READ = ("type", "factor", "original_context_length", "attn_factor", "finetuned")
_GGUF_SCALING_FIXED = {"yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_log_multiplier": 0.0}
_ROPE_FREQS_ARCHS = ("llama", "mistral")  # llama.cpp loads rope_freqs.weight for these only


def gguf_rope_scaling(meta: Mapping[str, Any], arch: str, rope_dim: int, context_length: int, tensors: Mapping[str, Any]) -> RopeScaling | None:
    """The RoPE scaling llama.cpp runs for a GGUF file (llama-model.cpp load_hparams), or None
    for plain RoPE. Raises ModelError naming the key or tensor of anything else."""
    prefix = f"{arch}.rope.scaling."

    def refuse(key: str, why: str) -> ModelError:
        return ModelError(f"GGUF {key} = {meta.get(key)!r}: {why}")

    for key in meta:
        if key.startswith(prefix) and key[len(prefix):] not in _GGUF_SCALING_READ + tuple(_GGUF_SCALING_FIXED) + ("yarn_ext_factor",):
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
            raise refuse(prefix + name, f"llama.cpp runs {arch} with {value} whatever the file says; zinfer refuses rather than pick one")
    if prefix + "yarn_ext_factor" in meta and _number(meta, prefix + "yarn_ext_factor", 0.0, refuse) != (1.0 if kind == "yarn" else 0.0):
        raise refuse(prefix + "yarn_ext_factor", f"llama.cpp ignores it for {arch}; zinfer refuses rather than pick one")
    original = int(_number(meta, prefix + "original_context_length", context_length, refuse, minimum=1))
    attn_factor = _number(meta, prefix + "attn_factor", 1.0, refuse, minimum=1e-6)
    freq_factors = _rope_freqs(tensors, arch, rope_dim)
    scaling = scaling_as_llama_cpp(kind, factor, original, attn_factor, freq_factors)
    return None if scaling.is_identity else scaling


def _number(meta: Mapping[str, Any], key: str, default: float, refuse: Any, minimum: float | None = None) -> float:
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
        raise ModelError(f"GGUF tensor 'rope_freqs.weight' must be F32 of shape ({rope_dim // 2},), got {t.qtype.name} {tuple(t.shape)}")
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


def llama3_freq_factors(base: float, rope_dim: int, factor: float, low_freq_factor: float, high_freq_factor: float, original: int) -> tuple[float, ...]:
    """HF's "llama3" rope_scaling as llama.cpp's converter turns it into rope_freqs.weight:
    1 for short wavelengths, `factor` for long ones, a smooth blend between (float32)."""
    freqs = (np.float32(1) / np.float32(base) ** (np.arange(0, rope_dim, 2, dtype=np.float32) / np.float32(rope_dim))).astype(np.float32)
    wavelen = np.float32(2 * math.pi) / freqs
    low_wavelen, high_wavelen = np.float32(original / low_freq_factor), np.float32(original / high_freq_factor)
    smooth = (np.float32(original) / wavelen - np.float32(low_freq_factor)) / np.float32(high_freq_factor - low_freq_factor)
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


def hf_rope_scaling(config: Mapping[str, Any], arch: str, rope_theta: float, rope_dim: int, context_length: int) -> RopeScaling | None:
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
        ff = llama3_freq_factors(rope_theta, rope_dim, factor, low, high, int(number("original_max_position_embeddings", 8192)))
        scaling = scaling_as_llama_cpp("linear", 0.0, 0, freq_factors=ff)
    return None if scaling.is_identity else scaling
