"""A model file whose weights hold a NaN or an infinity, or whose header is corrupt, is
refused at load with one line naming the file and the tensor or metadata key (issue 32):
never a model that serves NaN, never a RecursionError or a bare numpy error."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gguf_corrupt import flip_bytes, nested_metadata_gguf, set_dims, set_values, tensor_span
from test_model_errors import load
from tiny import write_tiny_gguf
from zinfer.models import weight_check
from zinfer.models.gguf_file import GGUFFile
from zinfer.models.spec import ModelError


def _byte(path, name: str, at: int) -> int:
    offset, _ = tensor_span(path, name)
    return path.read_bytes()[offset + at]


@pytest.fixture(scope="module")
def q8(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("m") / "q8.gguf", "llama", qtype=QT.Q8_0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_norm_weight_is_refused_naming_file_tensor_and_element(q8, tmp_path, bad):
    values = np.ones(64, np.float32)
    values[17] = bad
    path = set_values(q8, tmp_path / "bad-norm.gguf", "blk.1.ffn_norm.weight", values)
    with pytest.raises(ModelError) as info:
        load(path)
    assert str(info.value) == "bad-norm.gguf: tensor blk.1.ffn_norm.weight has non-finite values (first at element 17)"


@pytest.mark.parametrize("qt, scale_at", [(QT.Q8_0, 0), (QT.Q4_1, 2), (QT.Q5_0, 0)])
def test_a_non_finite_block_scale_is_refused_naming_the_block(tmp_path, qt, scale_at):
    good = write_tiny_gguf(tmp_path / "good.gguf", "llama", qtype=qt)
    load(good)  # the control
    block_bytes = {QT.Q8_0: 34, QT.Q4_1: 20, QT.Q5_0: 22}[qt]
    at = 5 * block_bytes + scale_at + 1  # the high byte of block 5's f16 scale (or min)
    path = flip_bytes(good, tmp_path / "flipped.gguf", "blk.0.ffn_up.weight", [at],
                      [0x7C & ~_byte(good, "blk.0.ffn_up.weight", at)])  # exponent bits all set
    with pytest.raises(ModelError, match=r"flipped\.gguf: tensor blk\.0\.ffn_up\.weight has non-finite values "
                                         r"\(first at element 160\)"):
        load(path)


def test_flipped_bytes_in_an_f32_tensor_are_refused(q8, tmp_path):
    at = [4 * 9 + 3, 4 * 9 + 2]  # element 9's exponent: 7 bits of its high byte, 1 of the next
    masks = [0x7F & ~_byte(q8, "output_norm.weight", at[0]), 0x80 & ~_byte(q8, "output_norm.weight", at[1])]
    path = flip_bytes(q8, tmp_path / "f.gguf", "output_norm.weight", at, masks)
    with pytest.raises(ModelError, match=r"f\.gguf: tensor output_norm\.weight has non-finite values "
                                         r"\(first at element 9\)"):
        load(path)


def test_deeply_nested_metadata_is_refused_naming_file_and_key(tmp_path):
    path = nested_metadata_gguf(tmp_path / "deep.gguf", "general.deep", 5000)
    with pytest.raises(ModelError, match=r"deep\.gguf: .*metadata key general\.deep: arrays nested more than 8 deep"):
        GGUFFile(path)
    GGUFFile(nested_metadata_gguf(tmp_path / "two.gguf", "general.two", 2))  # shallow nesting still reads


@pytest.mark.parametrize("dims", [[2**32, 2**32], [2**32, 2**32 + 1], [0, 64], [2**63, 2], [64, 2**40]],
                         ids=["wraps-to-0", "overflow", "zero", "huge", "past-eof"])
def test_corrupt_tensor_dims_are_refused_naming_file_and_tensor(q8, tmp_path, dims):
    path = set_dims(q8, tmp_path / "dims.gguf", "blk.0.ffn_up.weight", dims)
    with pytest.raises(ModelError, match=r"dims\.gguf: .*tensor blk\.0\.ffn_up\.weight"):
        load(path)


def test_a_passing_large_file_is_checked_once(tmp_path, monkeypatch):
    """A file of at least MIN_FILE_BYTES that passed leaves a marker; the next load of the
    same bytes skips the pass; a changed file is checked again."""
    monkeypatch.setattr(weight_check, "MIN_FILE_BYTES", 0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = write_tiny_gguf(tmp_path / "good.gguf", "llama")
    load(good)
    assert len(list((tmp_path / "cache").rglob("checked/*"))) == 1
    copy = tmp_path / "copy.gguf"
    shutil.copy(good, copy)
    set_values(copy, copy, "output_norm.weight", np.nan)
    with pytest.raises(ModelError, match="output_norm"):
        load(copy)


@pytest.mark.slow
def test_a_real_model_with_one_bad_scale_is_refused(tmp_path):
    """A copy of SmolLM2-135M (Q4_1) with one block's scale made inf."""
    from zinfer.models.pull import pull

    src = pull("smollm2-135m")
    path = tmp_path / "smollm2-flipped.gguf"
    shutil.copy(src, path)
    offset, _ = tensor_span(path, "blk.7.ffn_down.weight")
    with open(path, "r+b") as f:
        f.seek(offset + 20 * 1000)
        f.write(struct.pack("<e", np.inf))
    with pytest.raises(ModelError, match=r"smollm2-flipped\.gguf: tensor blk\.7\.ffn_down\.weight "
                                         r"has non-finite values \(first at element 32000\)"):
        load(path)


def test_deeply_nested_json_in_an_hf_directory_is_refused_naming_the_file(tmp_path):
    from tiny import write_tiny_hf

    d = write_tiny_hf(tmp_path / "hf", "llama")
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelError, match=r"config\.json: not valid JSON \(RecursionError"):
        load(d)


def test_a_non_finite_hf_weight_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file
    from tiny import write_tiny_hf

    d = write_tiny_hf(tmp_path / "hf", "qwen3")
    st = d / "model.safetensors"
    tensors = load_file(st)
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = np.nan
    save_file(tensors, st)
    with pytest.raises(ModelError, match=r"hf: tensor blk\.1\.ffn_down\.weight has non-finite values "
                                         r"\(first at element \d+\)"):
        load(d)


def test_a_tensor_whose_shape_is_not_the_models_is_refused(q8, tmp_path):
    """Dims swapped in the header: the same bytes, but the kernels would read the matrix
    with the model's shapes (past its rows): refused naming the tensor and both shapes."""
    path = set_dims(q8, tmp_path / "swapped.gguf", "blk.1.ffn_up.weight", [128, 64])
    with pytest.raises(ModelError, match=r"tensor 'blk\.1\.ffn_up\.weight' has shape \[64, 128\], "
                                         r"the model's hyperparameters need \[128, 64\]"):
        load(path)


@pytest.mark.parametrize("key, value, says", [
    ("llama.block_count", 2**32 - 1, "block_count = 4294967295 is out of range"),
    ("llama.attention.head_count", 0, "a hyperparameter holds a value zinfer cannot use"),
    ("llama.attention.head_count_kv", 3, "n_heads = 4 is not a multiple of n_kv_heads = 3"),
    ("llama.embedding_length", 10**9, "out of range"),
])
def test_hyperparameters_out_of_range_are_refused_at_once(tmp_path, key, value, says):
    """A block count of 2^32 - 1 used to hang the load building 4 billion layer flags."""
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", metadata={key: value})
    with time_limit(10), pytest.raises(ModelError, match=says):
        load(path)


def test_a_vocabulary_that_cannot_be_built_is_refused_naming_the_file(tmp_path):
    """Merges naming a token the vocabulary lacks: the tokenizers library's bare Exception
    becomes the one-line ModelError."""
    from zinfer.models.loader import open_model
    from zinfer.models.prompt import PromptBuilder

    src = open_model(write_tiny_gguf(tmp_path / "vocab.gguf", "llama"))
    src.gguf_metadata["tokenizer.ggml.merges"] = ["Ġ zq"] + list(src.gguf_metadata["tokenizer.ggml.merges"])
    with pytest.raises(ModelError, match=r"vocab\.gguf: its tokenizer cannot be built"):
        PromptBuilder.from_source(src)


class time_limit:
    """Fail the test if the block takes longer than `seconds` (SIGALRM)."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        import signal

        def late(*_):
            raise AssertionError(f"took more than {self.seconds} s")

        self.old = signal.signal(signal.SIGALRM, late)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)
