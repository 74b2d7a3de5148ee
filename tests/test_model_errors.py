"""A model zinfer cannot load is refused with a ModelError that names the problem.

Loading means what `zinfer run` does: open_model, then build_weights onto the CPU.
"""

from __future__ import annotations

import json

import pytest
from gguf import GGMLQuantizationType as QT

from zinfer.devices.cpu import CpuDevice
from zinfer.models.loader import open_model
from zinfer.models.spec import ModelError
from tiny import write_tiny_gguf, write_tiny_hf
from zinfer.models.weights import build_weights


def load(path):
    """Open a model and put its weights on the CPU, as serving it would."""
    src = open_model(path)
    return build_weights(src.spec, src.tensors, CpuDevice().upload)


def test_a_good_tiny_model_loads(tmp_path):
    # the control for every test below: the files they break load when whole
    load(write_tiny_gguf(tmp_path / "m.gguf", "llama"))
    load(write_tiny_hf(tmp_path / "hf", "llama"))


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "no-such-model.gguf"
    with pytest.raises(ModelError, match="no-such-model.gguf"):
        load(path)


@pytest.mark.parametrize("fraction", [0.0001, 0.01, 0.3, 0.9, 0.9999])
def test_truncated_gguf_names_the_file(tmp_path, fraction):
    whole = write_tiny_gguf(tmp_path / "whole.gguf", "qwen2").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: max(1, int(len(whole) * fraction))])
    with pytest.raises(ModelError, match="cut.gguf"):
        load(cut)


def test_empty_file_is_refused(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="empty.gguf"):
        load(empty)


def test_unsupported_architecture_is_named(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", gguf_arch="mamba")
    with pytest.raises(ModelError, match="mamba"):
        load(path)


def test_unsupported_hf_architecture_is_named(tmp_path):
    d = write_tiny_hf(tmp_path / "hf", "llama")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "rwkv"}))
    with pytest.raises(ModelError, match="rwkv"):
        load(d)


def test_unsupported_tensor_type_names_type_and_tensor(tmp_path):
    name = "blk.1.ffn_up.weight"
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", raw_types={name: QT.IQ4_NL})
    with pytest.raises(ModelError, match="IQ4_NL") as info:
        load(path)
    assert name in str(info.value)


def test_missing_tensor_is_named(tmp_path):
    name = "blk.1.ffn_up.weight"
    path = write_tiny_gguf(tmp_path / "m.gguf", "gemma3", omit=[name])
    with pytest.raises(ModelError, match=name.replace(".", r"\.")):
        load(path)


def test_missing_qwen2_bias_is_named(tmp_path):
    name = "blk.0.attn_k.bias"
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", omit=[name])
    with pytest.raises(ModelError, match=name.replace(".", r"\.")):
        load(path)


@pytest.mark.parametrize("key", ["llama.embedding_length", "llama.block_count",
                                 "llama.attention.layer_norm_rms_epsilon"])
def test_missing_metadata_key_is_named(tmp_path, key):
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", omit=[key])
    with pytest.raises(ModelError, match=key.replace(".", r"\.")):
        load(path)


def test_hf_dir_without_config_json(tmp_path):
    d = write_tiny_hf(tmp_path / "hf", "qwen3")
    (d / "config.json").unlink()
    with pytest.raises(ModelError, match="config.json"):
        load(d)


def test_hf_config_missing_key_is_named(tmp_path):
    d = write_tiny_hf(tmp_path / "hf", "qwen3")
    config = json.loads((d / "config.json").read_text())
    del config["hidden_size"]
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="hidden_size"):
        load(d)


def test_truncated_safetensors_names_the_file(tmp_path):
    d = write_tiny_hf(tmp_path / "hf", "mistral")
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    with pytest.raises(ModelError, match="model.safetensors"):
        load(d)
