"""zinfer.kernels.quants: gguf-py's block dequantizers applied chunk by chunk and row by
row, with size and type checks, equal bit for bit to gguf-py on whole tensors.

The values are gguf-py's own; what can go wrong here is the walk around them (chunk
boundaries inside a large tensor, rows picked out of it, typed and 3-d inputs, wrong sizes
and types). Real tensors from both pulled models cover F32, Q4_1, Q8_0 (SmolLM2) and F32,
Q4_K, Q5_0, Q6_K, Q8_0 (Gemma 3); the other types are built with gguf.quants.quantize where
it can (BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and from random bytes with finite fp16 scales
for every block type.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as reference
from gguf.quants import quantize as reference_quantize

from zinfer.kernels.oracle.quants import (
    BLOCK_SHAPES,
    UnsupportedTensorType,
    block_layout,
    dequantize,
    dequantize_rows,
)

# Byte offsets of the fp16 scale fields inside one block (ggml-common.h block_* structs).
FP16_FIELDS = {
    QT.Q4_0: [0],
    QT.Q4_1: [0, 2],
    QT.Q5_0: [0],
    QT.Q5_1: [0, 2],
    QT.Q8_0: [0],
    QT.Q2_K: [80, 82],
    QT.Q3_K: [108],
    QT.Q4_K: [0, 2],
    QT.Q5_K: [0, 2],
    QT.Q6_K: [208],
}
BLOCK_TYPES = list(FP16_FIELDS)


def assert_same_bits(ours: np.ndarray, ref: np.ndarray) -> None:
    """Equal float32 bit patterns (so -0.0 != 0.0 and NaN payloads must match)."""
    ref = np.asarray(ref, dtype=np.float32)
    assert ours.dtype == np.float32
    assert ours.shape == ref.shape
    a, b = ours.view(np.uint32), ref.view(np.uint32)
    bad = np.flatnonzero(a != b)
    assert bad.size == 0, (
        f"{bad.size} of {a.size} values differ; first at flat index {bad[0]}: "
        f"{ours.flat[bad[0]]!r} vs {ref.flat[bad[0]]!r}"
    )


def numpy_shape(t: gguf.ReaderTensor) -> tuple[int, ...]:
    """GGUF lists dims fastest first; numpy order is the reverse."""
    return tuple(int(d) for d in reversed(t.shape.tolist()))


@pytest.fixture(scope="module")
def readers(request):
    """Opened GGUFReaders by model fixture name, opened lazily once per module."""
    cache: dict[str, gguf.GGUFReader] = {}

    def get(name: str) -> gguf.GGUFReader:
        if name not in cache:
            cache[name] = gguf.GGUFReader(request.getfixturevalue(name))
        return cache[name]

    return get


def tensors_of_type(reader: gguf.GGUFReader, qtype: QT, limit: int) -> list:
    return [t for t in reader.tensors if t.tensor_type == qtype][:limit]


# ---- real tensors ----

REAL = [
    ("smollm2_path", QT.F32),
    ("smollm2_path", QT.Q4_1),
    ("smollm2_path", QT.Q8_0),
    ("gemma3_path", QT.F32),
    ("gemma3_path", QT.Q4_K),
    ("gemma3_path", QT.Q5_0),
    ("gemma3_path", QT.Q6_K),
    ("gemma3_path", QT.Q8_0),
]


@pytest.mark.slow
@pytest.mark.parametrize("model, qtype", REAL, ids=[f"{m[:-5]}-{q.name}" for m, q in REAL])
def test_real_tensors_match_gguf(readers, model, qtype):
    """Whole tensors (up to 4 of each type; embeddings as big row slices) match exactly."""
    reader = readers(model)
    tensors = tensors_of_type(reader, qtype, limit=4)
    assert tensors, f"{model} has no {qtype.name} tensor"
    for t in tensors:
        shape = numpy_shape(t)
        if t.name == "token_embd.weight":
            data, shape = t.data[:4096], (4096,) + shape[1:]
        else:
            data = t.data
        assert_same_bits(dequantize(data, qtype, shape), reference(data, qtype).reshape(shape))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_whole_token_embedding_matches_gguf_across_chunks(readers, model):
    """The full Q8_0 embedding, dequantized at once, matches at start, middle and end."""
    t = next(t for t in readers(model).tensors if t.name == "token_embd.weight")
    shape = numpy_shape(t)
    ours = dequantize(t.data, t.tensor_type, shape)
    assert ours.shape == shape
    n = shape[0]
    for start in (0, n // 2 - 1000, n - 3000):
        rows = slice(start, start + 3000)
        assert_same_bits(ours[rows], reference(t.data[rows], t.tensor_type))


@pytest.mark.slow
def test_real_embedding_rows_equal_rows_of_full_tensor(readers):
    t = next(t for t in readers("smollm2_path").tensors if t.name == "token_embd.weight")
    shape = numpy_shape(t)
    full = dequantize(t.data, t.tensor_type, shape)
    ids = np.array([[0, 1, 17, 49151], [5, 5, 300, 12345]])
    got = dequantize_rows(t.data, t.tensor_type, shape, ids)
    assert got.shape == (2, 4, shape[1])
    assert_same_bits(got, full[ids])


@pytest.mark.slow
def test_reader_typed_f32_accepted(readers):
    t = tensors_of_type(readers("gemma3_path"), QT.F32, limit=1)[0]
    assert t.data.dtype == np.float32
    got = dequantize(t.data, QT.F32, numpy_shape(t))
    assert_same_bits(got, np.asarray(t.data).reshape(numpy_shape(t)))


# ---- synthetic blocks ----


def random_weights(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Weights with a spread of magnitudes per row, one all-zero row and one constant row."""
    w = rng.normal(size=(rows, cols)).astype(np.float32)
    w *= np.logspace(-6, 2, rows, dtype=np.float32)[:, None]
    w[1] = 0.0
    w[2] = 0.375
    return w


def random_blocks(rng: np.random.Generator, qtype: QT, rows: int, cols: int) -> np.ndarray:
    """Random bytes [rows, row_bytes] whose fp16 fields hold finite values (some tiny)."""
    epb, bpb = BLOCK_SHAPES[qtype]
    data = rng.integers(0, 256, size=(rows * cols // epb, bpb), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        scales = rng.normal(scale=0.05, size=data.shape[0])
        scales[::7] *= 1e-4  # fp16 subnormals
        data[:, off : off + 2] = scales.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, -1)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.BF16])
def test_gguf_quantized_weights_match(qtype):
    rng = np.random.default_rng(int(qtype))
    w = random_weights(rng, rows=48, cols=512)
    data = reference_quantize(w, qtype)  # uint8 [48, row_bytes]
    assert_same_bits(dequantize(data, qtype, w.shape), reference(data, qtype))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=[q.name for q in BLOCK_TYPES])
def test_random_blocks_match(qtype):
    """Every bit pattern of codes and packed scales decodes as gguf-py decodes it."""
    rng = np.random.default_rng(100 + int(qtype))
    data = random_blocks(rng, qtype, rows=64, cols=1024)
    assert_same_bits(dequantize(data, qtype, (64, 1024)), reference(data, qtype))


def test_f16_all_finite_patterns_and_infinities():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]  # drop inf/nan, add the infinities back
    bits = np.concatenate([bits, np.array([0x7C00, 0xFC00], dtype=np.uint16)])
    data = bits.view(np.uint8).reshape(1, -1)
    got = dequantize(data, QT.F16, (bits.size,))
    assert_same_bits(got, reference(data, QT.F16).reshape(-1))
    assert got[-2] == np.inf and got[-1] == -np.inf


def test_bf16_every_pattern_is_the_top_half_of_a_float32():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    data = bits.view(np.uint8).reshape(256, 512)
    got = dequantize(data, QT.BF16, (256, 256))
    assert_same_bits(got, reference(data, QT.BF16))
    assert np.array_equal(got.reshape(-1).view(np.uint32), bits.astype(np.uint32) << 16)


def test_typed_f16_array_accepted_and_3d_shape():
    x = np.random.default_rng(1).normal(size=(2, 3, 64)).astype(np.float16)
    assert_same_bits(dequantize(x, QT.F16, (2, 3, 64)), x.astype(np.float32))


def test_q8_0_known_block():
    """One hand-built block: scale 0.5, codes -128..-97 -> -64.0..-48.5."""
    scale = np.array([0.5], np.float16).view(np.uint8)
    codes = np.arange(-128, -96, dtype=np.int8).view(np.uint8)
    block = np.concatenate([scale, codes])
    got = dequantize(block, QT.Q8_0, (32,))
    assert np.array_equal(got, np.arange(-128, -96, dtype=np.float32) * 0.5)


@pytest.mark.parametrize("qtype", BLOCK_TYPES + [QT.F16, QT.BF16, QT.F32], ids=lambda q: q.name)
def test_dequantize_rows_equals_rows_of_dequantize(qtype):
    rng = np.random.default_rng(7)
    epb, bpb = block_layout(qtype)
    shape = (3, 5, 512)  # 15 rows once leading dims are flattened
    if qtype in FP16_FIELDS:
        data = random_blocks(rng, qtype, rows=15, cols=512)
    else:
        data = rng.normal(size=shape).astype(np.float32)
        data = reference_quantize(data, qtype) if qtype != QT.F32 else data
    full = dequantize(data, qtype, shape).reshape(15, 512)
    rows = np.array([14, 0, 7, 7])
    assert_same_bits(dequantize_rows(data, qtype, shape, rows), full[rows])
    assert dequantize_rows(data, qtype, shape, np.array([], dtype=np.int64)).shape == (0, 512)


# ---- errors ----


def test_wrong_length_buffer_raises_value_error_with_sizes():
    data = np.zeros((4, 34 * 2), dtype=np.uint8)  # 4 rows of 64 Q8_0 values
    assert dequantize(data, QT.Q8_0, (4, 64)).shape == (4, 64)
    with pytest.raises(ValueError, match=r"Q8_0 .* needs 340 bytes, got 272"):
        dequantize(data, QT.Q8_0, (5, 64))
    with pytest.raises(ValueError, match="needs"):
        dequantize_rows(data[:, :-1], QT.Q8_0, (4, 64), [0])


def test_row_not_whole_blocks_raises_value_error():
    with pytest.raises(ValueError, match="whole blocks of 256"):
        dequantize(np.zeros(144, np.uint8), QT.Q4_K, (128, 2))


@pytest.mark.parametrize("qtype", [QT.IQ2_XXS, QT.Q8_K, QT.TQ1_0, QT.I8])
def test_unsupported_type_names_it(qtype):
    with pytest.raises(UnsupportedTensorType, match=qtype.name):
        dequantize(np.zeros(1024, np.uint8), qtype, (256,))
    with pytest.raises(UnsupportedTensorType, match=qtype.name):
        block_layout(qtype)
    assert issubclass(UnsupportedTensorType, ValueError)


def test_unknown_type_number_is_unsupported():
    with pytest.raises(UnsupportedTensorType, match="9999"):
        dequantize(np.zeros(4, np.uint8), 9999, (1,))


def test_row_index_out_of_range_raises_index_error():
    data = np.zeros((4, 34), dtype=np.uint8)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        dequantize_rows(data, QT.Q8_0, (4, 32), [1, 4])
    with pytest.raises(IndexError):
        dequantize_rows(data, QT.Q8_0, (4, 32), [-1])
