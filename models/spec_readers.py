"""A ModelSpec from either source: GGUF metadata (`{arch}.block_count`, ...) or a
HuggingFace config.json; checked before it is returned (models/spec_checks.py)."""

from __future__ import annotations

import math
from typing import Any, Mapping, TypedDict

from zinfer.kernels.oracle.rope import RopeScaling
from zinfer.models.rope_scaling import gguf_rope_scaling, hf_rope_scaling, swa_scaling
from zinfer.models.spec import ModelError, ModelSpec
from zinfer.models.spec_checks import check_layers, checked

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")


class _Common(TypedDict):
    """The ModelSpec fields every architecture of one source reads the same way."""

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
    rope_scaling: RopeScaling | None


def _gemma3_swa(n_layers: int, pattern: int) -> tuple[bool, ...]:
    """Gemma 3: every `pattern`-th layer is global, the others slide."""
    return tuple((i + 1) % pattern != 0 for i in range(n_layers))


def spec_from_gguf(meta: Mapping[str, Any], rope_interleaved_llama: bool = True,
                   tensors: Mapping[str, Any] | None = None) -> ModelSpec:
    """Build the spec from decoded GGUF metadata (and, for rope_freqs.weight, the file's
    tensors: name -> TensorData); a missing key raises ModelError naming it, as does RoPE
    scaling zinfer does not implement and a value out of range (models/spec_checks.py)."""
    return checked("GGUF metadata", lambda: _spec_from_gguf(meta, rope_interleaved_llama, tensors))


def _spec_from_gguf(meta: Mapping[str, Any], rope_interleaved_llama: bool,
                    tensors: Mapping[str, Any] | None) -> ModelSpec:
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
    d_ff = int(need("feed_forward_length"))
    vocab_size = int(vocab)
    context_length = int(need("context_length"))
    rms_eps = float(need("attention.layer_norm_rms_epsilon"))
    rope_base = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    rope_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    attn_scale = 1.0 / math.sqrt(head_dim)
    scaling = gguf_rope_scaling(meta, arch, rope_dim, context_length, tensors or {})
    common = _Common(arch=arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                     head_dim=head_dim, d_ff=d_ff, vocab_size=vocab_size, context_length=context_length,
                     rms_eps=rms_eps, rope_base=rope_base, rope_dim=rope_dim, rope_scaling=scaling)
    if arch in ("llama", "mistral"):
        window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
        return ModelSpec(
            **common,
            attn_scale=attn_scale,
            rope_interleaved=rope_interleaved_llama,
            sliding_window=window,
            swa_layers=(True,) * n_layers if window else (),
            rope_base_swa=rope_base,
            rope_scaling_swa=scaling,
        )
    if arch in ("qwen2", "qwen3"):
        return ModelSpec(**common, attn_scale=attn_scale, rope_interleaved=False, attn_bias=arch == "qwen2",
                         qk_norm=arch == "qwen3")
    # gemma3: llama.cpp hard-codes a pattern of 6 and a local RoPE base of 10000.
    pattern = int(meta.get("gemma3.attention.sliding_window_pattern", 6))
    return ModelSpec(
        **common,
        attn_scale=attn_scale,
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


_HF_ARCH = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
            "gemma3": "gemma3"}


def spec_from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    """Build the spec from a HuggingFace config.json (HF weights rotate halves); a value
    out of range raises ModelError (models/spec_checks.py)."""
    return checked("config.json", lambda: _spec_from_hf_config(config))


def _spec_from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
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
    parameters = config.get("rope_parameters") or {}  # transformers 5 nests rope_theta there
    rope_theta = float(config.get("rope_theta", parameters.get("rope_theta", 10000.0)))
    rope_dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    context_length = int(config.get("max_position_embeddings", 2048))
    scaling = hf_rope_scaling(config, arch, rope_theta, rope_dim, context_length)
    n_kv_heads = int(config.get("num_key_value_heads") or n_heads)
    d_ff = int(need("intermediate_size"))
    vocab_size = int(need("vocab_size"))
    common = _Common(arch=arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                     head_dim=head_dim, d_ff=d_ff, vocab_size=vocab_size, context_length=context_length,
                     rms_eps=float(config.get("rms_norm_eps", 1e-6)), rope_base=rope_theta, rope_dim=rope_dim,
                     rope_scaling=scaling)
    if arch in ("llama", "mistral"):
        window = int(config.get("sliding_window") or 0)
        return ModelSpec(
            **common,
            rope_interleaved=False,
            attn_scale=1.0 / math.sqrt(head_dim),
            attn_bias=bool(config.get("attention_bias", False)),
            sliding_window=window,
            swa_layers=(True,) * n_layers if window else (),
            rope_base_swa=rope_theta,
            rope_scaling_swa=scaling,
        )
    if arch in ("qwen2", "qwen3"):
        return ModelSpec(**common, rope_interleaved=False, attn_scale=1.0 / math.sqrt(head_dim),
                         attn_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    if "layer_types" in config:
        swa = tuple(t == "sliding_attention" for t in config["layer_types"])
    else:
        swa = _gemma3_swa(n_layers, int(config.get("sliding_window_pattern", 6)))
    return ModelSpec(
        **common,
        rope_interleaved=False,
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
