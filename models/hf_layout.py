"""HuggingFace tensor layout versus GGUF's: names, Q/K row order and Gemma's norm offset.

zinfer's canonical tensor names are GGUF's (`blk.3.attn_q.weight`). HF llama weights
rotate halves while GGUF llama weights were permuted for llama.cpp's pair rotation; the
spec's `rope_interleaved` says which rotation the loaded rows need, so rows are only
permuted when converting between formats. HF Gemma norms compute x * (1 + w); GGUF
stores 1 + w already.
"""

from __future__ import annotations

import re

import numpy as np

HF_MODEL_TYPE = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
HF_CLASS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GEMMA_NORMS = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def _layer_table(arch: str) -> dict[str, str]:
    if arch == "gemma3":
        return {**_LAYER_NAMES, **_GEMMA_NORMS}
    return {**_LAYER_NAMES, "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf_name: str, arch: str) -> str | None:
    """Canonical (GGUF) name for an HF tensor name, or None for tensors zinfer ignores."""
    hf_name = hf_name.removeprefix("language_model.")
    m = _LAYER_RE.match(hf_name)
    if m:
        part = _layer_table(arch).get(m.group(2))
        return f"blk.{m.group(1)}.{part}.{m.group(3)}" if part else None
    stem, _, kind = hf_name.rpartition(".")
    return f"{_TOP[stem]}.{kind}" if stem in _TOP else None


def hf_name(gguf_tensor: str, arch: str) -> str | None:
    """HF name for a canonical tensor name, or None if it has no HF counterpart."""
    parts = gguf_tensor.split(".")
    if parts[0] == "blk":
        inverse = {v: k for k, v in _layer_table(arch).items()}
        part = inverse.get(parts[2])
        return f"model.layers.{parts[1]}.{part}.{parts[3]}" if part else None
    inverse = {v: k for k, v in _TOP.items()}
    return f"{inverse[parts[0]]}.{parts[1]}" if parts[0] in inverse else None


def is_norm_weight(name: str) -> bool:
    """True for RMSNorm weights (vectors that Gemma offsets by 1 in HF layout)."""
    return name.endswith("norm.weight")


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """GGUF llama Q/K rows (pairs adjacent) -> HF rows (halves): inverse of llama.cpp's permute.

    w: [n_heads * head_dim, ...] (a weight or a bias)
    """
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF Q/K rows (halves) -> GGUF llama rows (pairs adjacent), as llama.cpp's converter does."""
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
