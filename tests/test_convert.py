"""`convert_gguf_to_hf`: the HF directory computes and tokenizes what the GGUF file does."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
import tokenizers
from gguf import GGMLQuantizationType as QT

from zinfer.devices.cpu import CpuDevice
from zinfer.devices.batch import ForwardBatch
from zinfer.models.convert import convert_gguf_to_hf
from zinfer.models.forward import round_logits
from zinfer.models.gguf_vocab import specials_from_gguf
from zinfer.models.loader import open_model
from zinfer.models.spec import ModelError
from zinfer.models.spec_readers import spec_from_gguf
from tiny import ARCHS, tiny_tokenizer_json, write_tiny_gguf
from zinfer.models.tokenizer import Tokenizer
from zinfer.models.weights import build_weights

GOLDENS = Path(__file__).parent / "goldens"
BLOCK = 16
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  two spaces, then\ttabs\nand lines; 12345 digits, émoji 😀",
]


class Model:
    def __init__(self, path):
        self.src = open_model(path)
        self.spec = self.src.spec
        self.dev = CpuDevice()
        self.w = build_weights(self.spec, self.src.tensors, self.dev.upload)

    def greedy(self, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
        """n greedy tokens, prefill then one decode round per token; and the first logits [vocab]."""
        kv = self.dev.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim, 8, BLOCK)
        table = list(range(8))
        logits = round_logits(self.spec, self.w, self.dev, kv, ForwardBatch.build([(ids, 0, table, True)], BLOCK))[0]
        first, out = logits, []
        for p in range(len(ids), len(ids) + n):
            out.append(int(np.argmax(logits)))
            logits = round_logits(self.spec, self.w, self.dev, kv,
                                  ForwardBatch.build([(out[-1:], p, table, True)], BLOCK))[0]
        return out, first


def same_spec(a, b) -> bool:
    """Specs equal but for the RoPE flavour and float32 rounding of rms_eps."""
    norm = lambda s: msgspec.structs.replace(s, rope_interleaved=False,  # noqa: E731
                                             rms_eps=float(np.float32(s.rms_eps)))
    return norm(a) == norm(b)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# ---- tiny models: every architecture, quantized weights ----


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_converted_dir_computes_what_the_gguf_does(tmp_path, arch):
    gguf_path = write_tiny_gguf(tmp_path / "m.gguf", arch, seed=7, qtype=QT.Q4_0)
    out = convert_gguf_to_hf(gguf_path, tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"]
    gg, hf = Model(gguf_path), Model(out)
    assert hf.src.format == "safetensors"
    assert same_spec(hf.spec, gg.spec)
    ids = [0, 40, 7, 260, 33, 291, 5, 100, 72, 250, 11, 12, 13, 280, 90, 91, 2, 3]
    toks_gg, first_gg = gg.greedy(ids, 6)
    toks_hf, first_hf = hf.greedy(ids, 6)
    assert rel_err(first_hf, first_gg) < 1e-5
    assert toks_hf == toks_gg


def test_tiny_converted_tokenizer_matches_an_independent_bpe(tmp_path):
    """tokenizer.json rebuilt from GGUF metadata encodes like one built with `tokenizers` directly."""
    out = convert_gguf_to_hf(write_tiny_gguf(tmp_path / "m.gguf", "llama"), tmp_path / "hf")
    converted = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    direct = tokenizers.Tokenizer.from_str(tiny_tokenizer_json())
    for text in TEXTS:
        ids = converted.encode(text, add_special_tokens=False).ids
        assert len(ids) > 5
        assert ids == direct.encode(text, add_special_tokens=False).ids
    # the tiny GGUF asks for BOS: the converted files say so both ways
    assert converted.encode("the").ids[0] == 0
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<|bos|>" and config["eos_token"] == "<|eos|>" and config["add_bos_token"] is True


def test_refuses_a_non_empty_output_dir(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "m.gguf", "qwen3")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(ModelError, match="busy"):
        convert_gguf_to_hf(gguf_path, busy)
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (convert_gguf_to_hf(gguf_path, empty) / "config.json").is_file()


def test_refuses_an_unloadable_gguf_without_writing(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "m.gguf", "llama", gguf_arch="mamba")
    with pytest.raises(ModelError, match="mamba"):
        convert_gguf_to_hf(gguf_path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


# ---- the real models ----


@pytest.fixture(scope="module", params=[pytest.param(m, marks=pytest.mark.slow) for m in ("smollm2", "gemma3")])
def converted(request, tmp_path_factory):
    """(name, GGUF path, its metadata, converted HF dir) of a real model."""
    gguf_path = request.getfixturevalue(f"{request.param}_path")
    out = convert_gguf_to_hf(gguf_path, tmp_path_factory.mktemp("convert") / "hf")
    return request.param, Path(gguf_path), open_model(gguf_path).gguf_metadata, out


def test_real_config_json_is_sane(converted):
    name, gguf_path, meta, out = converted
    config = json.loads((out / "config.json").read_text())
    spec = spec_from_gguf(meta)
    assert config["model_type"] == {"smollm2": "llama", "gemma3": "gemma3_text"}[name]
    assert config["hidden_size"] == spec.d_model and config["num_hidden_layers"] == spec.n_layers
    assert config["vocab_size"] == spec.vocab_size
    assert config["tie_word_embeddings"] is True  # both models share the embedding as LM head
    if name == "gemma3":
        assert config["query_pre_attn_scalar"] == spec.head_dim
        assert config["layer_types"].count("full_attention") == spec.n_layers // 6
    assert same_spec(open_model(out).spec, spec)


def test_real_converted_model_generates_the_same_tokens(converted):
    name, gguf_path, meta, out = converted
    tok = Tokenizer.from_gguf_metadata(meta)
    ids = tok.encode("The capital of France is")
    toks_gg, first_gg = Model(gguf_path).greedy(ids, 16)
    toks_hf, first_hf = Model(out).greedy(ids, 16)
    assert rel_err(first_hf, first_gg) < 1e-4
    assert toks_hf == toks_gg
    assert len(set(toks_gg)) > 3  # a real continuation, not one token repeated


def test_real_converted_tokenizer_matches_llama_cpp(converted):
    name, gguf_path, meta, out = converted
    hf = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    sp = specials_from_gguf(meta)
    from_dir = Tokenizer.from_dir(out)
    assert (from_dir.bos_id, from_dir.eos_id, from_dir.add_bos) == (sp.bos_id, sp.eos_id, sp.add_bos)
    assert from_dir.chat_template == sp.chat_template  # SmolLM2 has one, this Gemma 3 GGUF none
    assert (sp.chat_template is not None) == (name == "smollm2")
    goldens = json.loads((GOLDENS / f"tokens_{ {'smollm2': 'smollm2-135m', 'gemma3': 'gemma3-270m'}[name]}.json")
                         .read_text())
    for case in goldens["cases"]:
        assert hf.encode(case["text"]).ids == case["ids"], case["text"]  # BOS added as the model says
        assert from_dir.encode(case["text"]) == case["ids"], case["text"]
