"""ModelSpec: everything the forward pass needs to know about an architecture, and
ModelError, how the models/ modules refuse a model.

One spec is built from either source (models/spec_readers.py): GGUF metadata
(`{arch}.block_count`, ...) or a HuggingFace config.json. The forward reads only the spec,
never the source format.
"""

from __future__ import annotations

import msgspec

from zinfer.kernels.oracle.rope import RopeScaling


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
    (kernels/oracle/rope.py), None for plain RoPE; rope_scaling_swa is the sliding layers' (Gemma 3
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
