"""cpu-llama rounds activations as llama.cpp does before quantized products."""

from __future__ import annotations

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

from zinfer.kernels.llama_cpp.llama_numerics import round_activations as quantize_activations


def test_q8_0_activations_equal_ggml_q8_0_round_trip():
    x = (np.random.default_rng(0).standard_normal((5, 576)) * 3).astype(np.float32)
    want = dequantize(quantize(x, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(quantize_activations(x, "Q8_0"), want)


def test_q8_k_activations_are_close_and_not_identity():
    x = (np.random.default_rng(1).standard_normal((3, 512)) * 2).astype(np.float32)
    y = quantize_activations(x, "Q8_K")
    step = np.abs(x).reshape(3, 2, 256).max(-1) / 127  # [3, 2] one quantum per block
    err = np.abs(y - x).reshape(3, 2, 256).max(-1)
    assert np.all(err <= step * 0.5 + 1e-6) and not np.array_equal(x, y)


def test_f16_and_none():
    x = np.float32([[1.0001, -2.5, 3.3333333]])
    assert np.array_equal(quantize_activations(x, "F16"), x.astype(np.float16).astype(np.float32))
    assert quantize_activations(x, None) is x
