"""Convert a GGUF model to a HuggingFace directory (`zinfer convert`).

The output is what transformers and zinfer's own loader read: config.json,
model.safetensors with every tensor dequantized to float32 in HF names and layout
(llama/mistral Q/K rows un-permuted back to rotate-half order, Gemma norms as the w of
x * (1 + w)), tokenizer.json and tokenizer_config.json. Quantized weights are
dequantized exactly, so the HF model computes what the GGUF model computes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import save_file

from zinfer.kernels.oracle.quants import UnsupportedTensorType, dequantize
from zinfer.kernels.tensor import TensorData
from zinfer.models.gguf_file import GGUFFile
from zinfer.models.gguf_vocab import specials_from_gguf, tokenizer_json_from_gguf
from zinfer.models.hf_layout import HF_CLASS, HF_MODEL_TYPE, hf_name, is_norm_weight, unpermute_qk
from zinfer.models.spec import ModelError, ModelSpec
from zinfer.models.spec_readers import spec_from_gguf



def convert_gguf_to_hf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Write the HF directory equivalent to the GGUF model at `gguf_path`; returns `out_dir`.

    Refuses (ModelError) when out_dir exists and is not empty, and for any file, type or
    architecture the loader would refuse.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelError(f"output directory {out} exists and is not empty")
    f = GGUFFile(gguf_path)
    spec = spec_from_gguf(f.metadata, tensors=f.tensors)
    if spec.rope_scaling is not None or spec.rope_scaling_swa is not None:
        scaling = spec.rope_scaling or spec.rope_scaling_swa
        raise ModelError(f"{Path(gguf_path).name}: RoPE scaling ({scaling}) is not converted to config.json yet")
    tied = "output.weight" not in f.tensors
    tensors = hf_tensors(spec, f.tensors)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(spec, f.metadata, tied)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if "tokenizer.ggml.tokens" in f.metadata:
        tok_json, tok_config = tokenizer_files(f.metadata, spec)
        (out / "tokenizer.json").write_text(tok_json)
        (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    return out


def hf_config(spec: ModelSpec, meta: Mapping[str, Any], tied: bool) -> dict[str, Any]:
    """config.json from which spec_from_hf_config rebuilds `spec` (rotate-half RoPE)."""
    config: dict[str, Any] = {
        "architectures": [HF_CLASS[spec.arch]],
        "model_type": HF_MODEL_TYPE[spec.arch],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": spec.d_ff,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.context_length,
        "rms_norm_eps": _f32(spec.rms_eps),
        "rope_theta": _f32(spec.rope_base),
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    if spec.rope_dim != spec.head_dim:
        config["partial_rotary_factor"] = spec.rope_dim / spec.head_dim
    for key in ("bos_token_id", "eos_token_id"):
        gguf_key = f"tokenizer.ggml.{key}"
        if gguf_key in meta:
            config[key] = int(meta[gguf_key])
    if spec.arch in ("llama", "mistral", "qwen2", "qwen3"):
        config["hidden_act"] = "silu"
    if spec.arch in ("llama", "mistral", "qwen3"):
        config["attention_bias"] = spec.attn_bias
    if spec.arch == "mistral":
        config["sliding_window"] = spec.sliding_window or None
    if spec.arch == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None)
    if spec.arch == "gemma3":
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=_f32(spec.attn_scale**-2),
            sliding_window=spec.sliding_window,
            layer_types=["sliding_attention" if s else "full_attention" for s in spec.swa_layers],
            rope_local_base_freq=_f32(spec.rope_base_swa),
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
        )
        if "gemma3.attention.sliding_window_pattern" in meta:
            config["sliding_window_pattern"] = int(meta["gemma3.attention.sliding_window_pattern"])
    return config


def hf_tensors(spec: ModelSpec, tensors: Mapping[str, TensorData]) -> dict[str, np.ndarray]:
    """Every tensor with an HF counterpart, dequantized to float32, in HF names and layout."""
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        hf = hf_name(name, spec.arch)
        if hf is None:
            continue  # e.g. llama.cpp's rope_freqs: computed, not stored, on the HF side
        try:
            w = dequantize(t.data, t.qtype, t.shape)  # float32, numpy order [out, in]
        except UnsupportedTensorType as exc:
            raise ModelError(f"tensor {name}: {exc}") from None
        if spec.arch in ("llama", "mistral") and ".attn_q." in name:
            w = unpermute_qk(w, spec.n_heads)
        elif spec.arch in ("llama", "mistral") and ".attn_k." in name:
            w = unpermute_qk(w, spec.n_kv_heads)
        elif spec.arch == "gemma3" and is_norm_weight(name):
            w = w - np.float32(1.0)  # GGUF stores 1 + w
        out[hf] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def tokenizer_files(meta: Mapping[str, Any], spec: ModelSpec) -> tuple[str, dict[str, Any]]:
    """(tokenizer.json text, tokenizer_config.json dict) from GGUF tokenizer metadata."""
    try:
        tok_json = tokenizer_json_from_gguf(meta)
        sp = specials_from_gguf(meta)
    except ValueError as exc:
        raise ModelError(f"GGUF tokenizer: {exc}") from None
    tokens = meta["tokenizer.ggml.tokens"]
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.context_length,
        "add_bos_token": sp.add_bos,
        "add_eos_token": sp.add_eos,
    }
    specials = (("bos_token", sp.bos_id), ("eos_token", sp.eos_id), ("unk_token", sp.unk_id), ("pad_token", sp.pad_id))
    for key, ident in specials:
        if ident is not None:
            config[key] = tokens[ident]
    if sp.chat_template:
        config["chat_template"] = sp.chat_template
    return tok_json, config


def _f32(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (GGUF stores f32)."""
    return float(str(np.float32(x)))
