"""Tiny random-weight models for tests, in HF and GGUF layouts, for every architecture.

`write_tiny_hf` and `write_tiny_gguf` called with the same arch, seed and overrides
describe the same network: one set of arrays is drawn (in HF layout) and written either
as is, or turned into GGUF layout the way llama.cpp's converter does (llama/mistral
Q/K rows permuted for pair-rotating RoPE, Gemma norms stored as 1 + w). Both carry the
same ~300-token byte-level BPE vocabulary, so text round-trips too.

Overrides are config.json keys (`num_hidden_layers=1`, `sliding_window=4`, ...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Collection, Mapping

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from safetensors.numpy import save_file

from zinfer.models.hf_layout import HF_CLASS, HF_MODEL_TYPE, gguf_name, permute_qk

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")

_BOS, _EOS = "<|bos|>", "<|eos|>"
# Merges of the tiny vocabulary, in rank order ("Ġ" is the byte-level space).
_MERGES = [
    "Ġ t", "h e", "i n", "e r", "a n", "o n", "r e", "Ġ a", "Ġ s", "Ġ w", "Ġt he", "Ġ o", "e n",
    "a t", "o r", "i s", "Ġ c", "e s", "Ġ f", "Ġ b", "i t", "Ġ p", "a r", "Ġ m", "l l", "o u",
    "Ġ h", "Ġ i", "e d", "in g", "Ġ d", "Ġ l", "Ġ n", "l e", "Ġ in", "Ġ is", "Ġo f", "Ġa n",
    "Ġan d", "Ġt o",
]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, llama.cpp token types): 2 control tokens, 256 bytes, the merges."""
    tokens = [_BOS, _EOS] + [_bytes_to_unicode()[b] for b in range(256)]
    known = set(tokens)
    for m in _MERGES:
        a, b = m.split(" ")
        assert a in known and b in known, m
        tokens.append(a + b)
        known.add(a + b)
    types = [3, 3] + [1] * (len(tokens) - 2)
    return tokens, list(_MERGES), types


def tiny_config(arch: str, **overrides: Any) -> dict[str, Any]:
    """The config.json of a tiny `arch` model (d_model 64, 2 layers, 4 heads over 2 KV heads)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r} (have {', '.join(ARCHS)})")
    tokens, _, _ = tiny_vocab()
    config: dict[str, Any] = {
        "architectures": [HF_CLASS[arch]],
        "model_type": HF_MODEL_TYPE[arch],
        "vocab_size": len(tokens),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": arch in ("llama", "gemma3"),
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float32",
        "hidden_act": "silu",
    }
    if arch == "llama":
        config["attention_bias"] = False
    if arch == "mistral":
        config["sliding_window"] = 8
    if arch == "qwen2":
        config.update(rope_theta=1000000.0, use_sliding_window=False, sliding_window=None)
    if arch == "qwen3":
        config.update(rms_norm_eps=1e-6, attention_bias=False)
    if arch == "gemma3":
        del config["hidden_act"]
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            query_pre_attn_scalar=16,
            sliding_window=4,
            sliding_window_pattern=2,  # layer 0 slides, layer 1 is global
        )
    config.update(overrides)
    return config


def tiny_weights(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights in HF layout and names for `config`.

    Matrices and biases ~ N(0, 0.1); norms ~ 1 + N(0, 0.1) (Gemma's HF norms store the
    offset w of x * (1 + w), so ~ N(0, 0.1) there).
    """
    rng = np.random.default_rng(seed)
    gemma = config["model_type"].startswith("gemma3")
    d, ff, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    H, Hkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or d // H

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return mat(n) + np.float32(0.0 if gemma else 1.0)

    w = {"model.embed_tokens.weight": mat(V, d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "self_attn.q_proj.weight"] = mat(H * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(Hkv * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(Hkv * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, H * hd)
        if config["model_type"] == "qwen2" or config.get("attention_bias"):
            w[p + "self_attn.q_proj.bias"] = mat(H * hd)
            w[p + "self_attn.k_proj.bias"] = mat(Hkv * hd)
            w[p + "self_attn.v_proj.bias"] = mat(Hkv * hd)
        if config["model_type"] in ("qwen3", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(d)
            w[p + "post_feedforward_layernorm.weight"] = norm(d)
        w[p + "mlp.gate_proj.weight"] = mat(ff, d)
        w[p + "mlp.up_proj.weight"] = mat(ff, d)
        w[p + "mlp.down_proj.weight"] = mat(d, ff)
    w["model.norm.weight"] = norm(d)
    if not config.get("tie_word_embeddings"):
        w["lm_head.weight"] = mat(V, d)
    return w


def tiny_tokenizer_json() -> str:
    """tokenizer.json text of the tiny vocabulary (GPT-2 style byte-level BPE)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    tokens, merges, _ = tiny_vocab()
    tok = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([_BOS, _EOS])
    return tok.to_str()


def write_tiny_hf(out_dir: str | os.PathLike, arch: str, seed: int = 0, **overrides: Any) -> Path:
    """Write config.json, model.safetensors (f32) and tokenizer.json of a tiny model; returns the dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config(arch, **overrides)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tiny_weights(config, seed), str(out / "model.safetensors"))
    (out / "tokenizer.json").write_text(tiny_tokenizer_json())
    return out


def to_gguf_layout(hf: str, w: np.ndarray, config: dict[str, Any]) -> tuple[str, np.ndarray]:
    """(canonical name, array in GGUF layout) for one HF tensor, as llama.cpp's converter stores it."""
    arch = "gemma3" if config["model_type"].startswith("gemma3") else config["model_type"]
    name = gguf_name(hf, arch)
    if name is None:
        raise ValueError(f"tensor {hf} has no GGUF name")
    if arch in ("llama", "mistral") and ".attn_q." in name:
        w = permute_qk(w, config["num_attention_heads"])
    elif arch in ("llama", "mistral") and ".attn_k." in name:
        w = permute_qk(w, config["num_key_value_heads"])
    elif arch == "gemma3" and name.endswith("norm.weight"):
        w = w + np.float32(1.0)
    return name, np.ascontiguousarray(w, dtype=np.float32)


def _gguf_metadata(writer: gguf.GGUFWriter, arch: str, config: dict[str, Any]) -> None:
    """The hyperparameter keys spec_from_gguf reads, from a tiny config.json."""
    H = config["num_attention_heads"]
    hd = config.get("head_dim") or config["hidden_size"] // H
    writer.add_uint32(f"{arch}.block_count", config["num_hidden_layers"])
    writer.add_uint32(f"{arch}.embedding_length", config["hidden_size"])
    writer.add_uint32(f"{arch}.feed_forward_length", config["intermediate_size"])
    writer.add_uint32(f"{arch}.context_length", config["max_position_embeddings"])
    writer.add_uint32(f"{arch}.attention.head_count", H)
    writer.add_uint32(f"{arch}.attention.head_count_kv", config["num_key_value_heads"])
    writer.add_uint32(f"{arch}.attention.key_length", hd)
    writer.add_uint32(f"{arch}.attention.value_length", hd)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    writer.add_float32(f"{arch}.rope.freq_base", config["rope_theta"])
    writer.add_uint32(f"{arch}.rope.dimension_count", hd)
    writer.add_uint32(f"{arch}.vocab_size", config["vocab_size"])
    if arch == "mistral" and config.get("sliding_window"):
        writer.add_uint32(f"{arch}.attention.sliding_window", config["sliding_window"])
    if arch == "gemma3":
        writer.add_uint32("gemma3.attention.sliding_window", config["sliding_window"])
        writer.add_uint32("gemma3.attention.sliding_window_pattern", config.get("sliding_window_pattern", 6))
        writer.add_float32("gemma3.rope.freq_base_swa", config.get("rope_local_base_freq", 10000.0))
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") in ("linear", "yarn"):  # as llama.cpp's converter writes them
        writer.add_rope_scaling_type(gguf.RopeScalingType(scaling["rope_type"]))
        writer.add_rope_scaling_factor(scaling["factor"])
        if scaling["rope_type"] == "yarn":
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])


def _rope_freqs(config: dict[str, Any]) -> np.ndarray | None:
    """rope_freqs.weight [head_dim/2] of an HF "llama3" rope_scaling, as llama.cpp's converter makes it."""
    from zinfer.models.rope_scaling import llama3_freq_factors

    s = config.get("rope_scaling") or {}
    if s.get("rope_type") != "llama3":
        return None
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    ff = llama3_freq_factors(config["rope_theta"], hd, s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                             s["original_max_position_embeddings"])
    return np.array(ff, np.float32)


def _gguf_tokenizer(writer: gguf.GGUFWriter) -> None:
    tokens, merges, types = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(True)


def write_tiny_gguf(
    path: str | os.PathLike,
    arch: str,
    seed: int = 0,
    qtype: QT = QT.F32,
    *,
    gguf_arch: str | None = None,
    omit: Collection[str] = (),
    raw_types: Mapping[str, QT] | None = None,
    metadata: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """Write the tiny model of (arch, seed, overrides) as a GGUF file; returns its path.

    Matrices whose rows are whole `qtype` blocks are stored as `qtype` (gguf.quants);
    norms and biases stay F32, as llama.cpp stores them. To write files zinfer must
    refuse: `gguf_arch` overrides general.architecture, `omit` names tensors or
    metadata keys to leave out, `raw_types` stores the named tensors as zero bytes of
    another type (one gguf.quants cannot write, e.g. IQ4_NL), `metadata` adds keys
    (str, bool, int as uint32, float as float32). An HF `rope_scaling` override is written
    as llama.cpp's converter does: linear/yarn as rope.scaling.* keys, llama3 as rope_freqs.weight.
    """
    path = Path(path)
    config = tiny_config(arch, **overrides)
    name_arch = gguf_arch or arch
    writer = gguf.GGUFWriter(str(path), name_arch)
    writer.add_name(f"tiny-{arch}")
    _gguf_metadata(writer, name_arch, config)
    _gguf_tokenizer(writer)
    for key, value in (metadata or {}).items():
        add = {str: writer.add_string, bool: writer.add_bool, int: writer.add_uint32,
               float: writer.add_float32}[type(value)]
        add(key, value)
    for key in omit:
        writer.kv_data[0].pop(key, None)
    rope_freqs = _rope_freqs(config)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    raw_types = raw_types or {}
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    for hf, w in tiny_weights(config, seed).items():
        name, w = to_gguf_layout(hf, w, config)
        if name in omit:
            continue
        if name in raw_types:
            writer.add_tensor(name, _zero_blocks(w.shape, raw_types[name]), raw_dtype=raw_types[name])
        elif qtype != QT.F32 and w.ndim == 2 and w.shape[-1] % block == 0:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _zero_blocks(shape: tuple[int, ...], qtype: QT) -> np.ndarray:
    """All-zero raw bytes of a `qtype` tensor of numpy `shape`: uint8 [rows, row_bytes]."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        raise ValueError(f"{qtype.name} needs rows of whole {block}-element blocks, got {shape}")
    return np.zeros((int(np.prod(shape[:-1])), shape[-1] // block * type_size), np.uint8)
