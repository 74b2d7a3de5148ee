"""Tiny random models: the HF and GGUF layouts of one network compute the same logits.

This is the check on the format traps: GGUF llama Q/K rows are permuted for pair
rotation (rope_interleaved) while HF rows rotate halves; Gemma norms are 1 + w in GGUF
and w in HF. Getting either wrong changes the logits by far more than the tolerance.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from zinfer.devices.cpu import CpuDevice
from zinfer.devices.batch import ForwardBatch
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from tiny import ARCHS, write_tiny_gguf, write_tiny_hf
from zinfer.models.weights import build_weights

BLOCK = 16
PROMPT = [0, 40, 7, 260, 33, 291, 5, 100, 72, 250, 11, 12, 13, 280, 90, 91, 2, 3, 200, 201]


class Loaded:
    """A model on the CPU with its own KV pool; `logits(ids)` prefills from position 0."""

    def __init__(self, path):
        self.src = open_model(path)
        self.spec = self.src.spec
        self.dev = CpuDevice()
        self.w = build_weights(self.spec, self.src.tensors, self.dev.upload)

    def logits(self, ids, decode_after: int = 0) -> np.ndarray:
        """Last-token logits [vocab]; with decode_after=n the last n tokens go one at a time."""
        kv = self.dev.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim, 8, BLOCK)
        table = list(range(8))
        split = len(ids) - decode_after
        out = round_logits(self.spec, self.w, self.dev, kv, ForwardBatch.build([(ids[:split], 0, table, True)], BLOCK))
        for p in range(split, len(ids)):
            out = round_logits(self.spec, self.w, self.dev, kv,
                               ForwardBatch.build([(ids[p : p + 1], p, table, True)], BLOCK))
        return out[0]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_and_gguf_layouts_give_equal_logits(tmp_path, arch):
    hf = Loaded(write_tiny_hf(tmp_path / "hf", arch, seed=3))
    gg = Loaded(write_tiny_gguf(tmp_path / "m.gguf", arch, seed=3))
    # the same spec, but for the RoPE flavour the stored rows need
    assert hf.spec.rope_interleaved is False
    assert gg.spec.rope_interleaved is (arch in ("llama", "mistral"))
    norm = dict(rope_interleaved=False, rms_eps=float(np.float32(gg.spec.rms_eps)))
    assert msgspec.structs.replace(hf.spec, **norm) == msgspec.structs.replace(gg.spec, **norm)

    a, b = hf.logits(PROMPT), gg.logits(PROMPT)
    assert a.shape == (hf.spec.vocab_size,)
    assert a.std() > 0.3  # not degenerate: the comparison means something
    assert rel_err(a, b) < 1e-4
    assert rel_err(hf.logits(PROMPT, decode_after=3), gg.logits(PROMPT, decode_after=3)) < 1e-4


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_different_seed_gives_different_logits(tmp_path, arch):
    a = Loaded(write_tiny_hf(tmp_path / "a", arch, seed=0)).logits(PROMPT)
    b = Loaded(write_tiny_hf(tmp_path / "b", arch, seed=1)).logits(PROMPT)
    assert rel_err(a, b) > 0.1


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0])
def test_quantized_gguf_stays_close_to_f32(tmp_path, qtype):
    f32 = Loaded(write_tiny_hf(tmp_path / "hf", "qwen3"))
    q = Loaded(write_tiny_gguf(tmp_path / "q.gguf", "qwen3", qtype=qtype))
    assert q.src.quant_types[qtype.name] > 0
    err = rel_err(q.logits(PROMPT), f32.logits(PROMPT))
    assert 0 < err < (0.05 if qtype == QT.Q8_0 else 0.3)


def _gemma_all_sliding(tmp_path, name, window):
    # sliding_window_pattern 3 over 2 layers: both layers slide (every 3rd would be global)
    return Loaded(write_tiny_gguf(tmp_path / name, "gemma3", sliding_window=window, sliding_window_pattern=3))


def test_gemma3_sliding_window_hides_old_tokens(tmp_path):
    """With window 4 and 2 sliding layers, the last token sees back 2 * 3 = 6 positions."""
    ids = PROMPT[:12]
    changed = list(ids)
    changed[2] = 150  # 9 positions before the last one
    near = list(ids)
    near[8] = 150  # 3 positions before the last one
    sliding = _gemma_all_sliding(tmp_path, "w4.gguf", 4)
    assert sliding.spec.swa_layers == (True, True)
    base = sliding.logits(ids)
    np.testing.assert_allclose(sliding.logits(changed), base, rtol=0, atol=1e-6 * np.abs(base).max())
    assert rel_err(sliding.logits(near), base) > 1e-3

    full = _gemma_all_sliding(tmp_path, "w0.gguf", 0)
    assert rel_err(full.logits(changed), full.logits(ids)) > 1e-3


def test_gemma3_global_layer_sees_everything(tmp_path):
    """The default tiny gemma3 has one global layer: an old token does change the output."""
    m = Loaded(write_tiny_gguf(tmp_path / "m.gguf", "gemma3"))
    assert m.spec.swa_layers == (True, False)
    ids = PROMPT[:12]
    changed = list(ids)
    changed[2] = 150
    assert rel_err(m.logits(changed), m.logits(ids)) > 1e-3


def test_qwen2_attention_biases_are_used(tmp_path):
    """Zeroing the q/k/v biases of a tiny qwen2 changes its logits."""
    with_bias = Loaded(write_tiny_hf(tmp_path / "hf", "qwen2"))
    base = with_bias.logits(PROMPT)
    for layer in with_bias.w.layers:
        layer.bq, layer.bk, layer.bv = (np.zeros_like(b) for b in (layer.bq, layer.bk, layer.bv))
    assert rel_err(with_bias.logits(PROMPT), base) > 1e-3
