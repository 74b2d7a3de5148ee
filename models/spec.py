"""ModelSpec: everything the forward pass needs to know about an architecture.

One spec is built from either source: GGUF metadata (`{arch}.block_count`, ...) or a
HuggingFace config.json. The forward reads only the spec, never the source format.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import msgspec

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

    def layer_window(self, layer: int) -> int:
        """Sliding window of `layer` in tokens, 0 for full attention."""
        return self.sliding_window if self.swa_layers and self.swa_layers[layer] else 0

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_swa if self.layer_window(layer) else self.rope_base


def _gemma3_swa(n_layers: int, pattern: int) -> tuple[bool, ...]:
    """Gemma 3: every `pattern`-th layer is global, the others slide."""
    return tuple((i + 1) % pattern != 0 for i in range(n_layers))


def spec_from_gguf(meta: Mapping[str, Any], rope_interleaved_llama: bool = True) -> ModelSpec:
    """Build the spec from decoded GGUF metadata; a missing key raises ModelError naming it."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def need(key: str) -> Any:
        full = f"{arch}.{key}"
        if full not in meta:
            raise ModelError(f"GGUF metadata key {full!r} is missing")
        return meta[full]

    n_layers = int(need("block_count"))
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
    if arch in ("llama", "mistral"):
        window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
        return ModelSpec(
            **common,
            rope_interleaved=rope_interleaved_llama,
            sliding_window=window,
            swa_layers=(True,) * n_layers if window else (),
            rope_base_swa=common["rope_base"],
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
    )


_HF_ARCH = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "gemma3": "gemma3"}


def spec_from_hf_config(config: Mapping[str, Any]) -> ModelSpec:
    """Build the spec from a HuggingFace config.json (HF weights rotate halves)."""
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
    n_layers = int(need("num_hidden_layers"))
    scaling = config.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise ModelError(f"unsupported rope_scaling {scaling!r} in config.json")
    common = dict(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        d_ff=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        context_length=int(config.get("max_position_embeddings", 2048)),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_base=float(config.get("rope_theta", 10000.0)),
        rope_dim=int(head_dim * config.get("partial_rotary_factor", 1.0)),
        rope_interleaved=False,
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
    )
