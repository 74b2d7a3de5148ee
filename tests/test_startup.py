"""Start-up: the GGUF header read without gguf-py's per-value views, the KV pool sized
from --max-running and --max-model-len, and what a user sees when a request cannot fit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from tiny import write_tiny_gguf
from zinfer.models.gguf_file import GGUFFile
from zinfer.models.tokenizer import Tokenizer


def reader_view(path) -> tuple[dict, dict]:
    """(metadata, name -> (qtype, shape, dtype, data shape, file offset)) as gguf.GGUFReader reads them."""
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (QT(t.tensor_type), tuple(int(d) for d in reversed(t.shape.tolist())), t.data.dtype, t.data.shape, int(t.data_offset))
               for t in r.tensors}
    return meta, tensors


def assert_same_as_reader(path) -> GGUFFile:
    f = GGUFFile(path)
    meta, tensors = reader_view(path)
    assert f.metadata.keys() == meta.keys()
    for key, value in meta.items():
        assert f.metadata[key] == value and type(f.metadata[key]) is type(value), key
    assert f.tensors.keys() == tensors.keys()
    base = f._map.ctypes.data
    for name, t in f.tensors.items():
        assert (t.qtype, t.shape, t.data.dtype, t.data.shape, t.data.ctypes.data - base) == tensors[name], name
        assert np.shares_memory(t.data, f._map), f"{name} was copied out of the memory map"
    return f


@pytest.mark.parametrize("qtype", [QT.F32, QT.Q8_0, QT.Q4_0])
def test_header_reads_as_gguf_py_reads_it(tmp_path, qtype):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_bool("test.flag", True)
    writer.add_float32("test.f32", 0.1)
    writer.add_float64("test.f64", 0.1)
    writer.add_int64("test.i64", -5)
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_array("test.floats", [0.5, 0.25])
    writer.add_array("test.texts", ["a", "", "ü 日本"])
    writer.add_string("test.empty", "")
    writer.add_tensor("w", np.arange(64, dtype=np.float32).reshape(2, 32))
    writer.add_tensor("h", np.ones(32, np.float16))
    writer.add_tensor("q", gguf.quants.quantize(np.ones((3, 64), np.float32), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = assert_same_as_reader(path)
    assert f.metadata["test.texts"] == ["a", "", "ü 日本"]
    assert f.tensors["w"].data[1, 31] == 63.0


def test_tiny_model_vocabulary_encodes_token_for_token_as_before(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", qtype=QT.Q8_0)
    f = assert_same_as_reader(path)
    old = Tokenizer.from_gguf_metadata(reader_view(path)[0])
    new = Tokenizer.from_gguf_metadata(f.metadata)
    text = "Hello wörld, 123 <|im_start|>  tabs\tand\nlines 日本"
    assert new.encode(text) == old.encode(text) and len(new.encode(text)) > 10
    assert new.vocab_size == old.vocab_size
    assert [new.token_bytes(i) for i in range(new.vocab_size)] == [old.token_bytes(i) for i in range(old.vocab_size)]


@pytest.mark.slow
def test_real_vocabulary_reads_as_gguf_py_reads_it(smollm2_path):
    f = assert_same_as_reader(smollm2_path)
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
