"""cpu-fast computes the same numbers on the run that compiles its kernels as on every
later run that loads them from numba's on-disk cache.

Numba runs a parallel kernel's body (and any njit function it calls) from that body's own
LLVM module in the process that compiles it, but from the caller's copy, optimized a second
time, in processes that load the cache. With value-changing fast-math flags ("reassoc") the
two copies rounded the attention softmax differently, and SmolLM2's greedy ids changed
between a first run and the later ones. Each run here is a fresh interpreter: the first
with an empty NUMBA_CACHE_DIR, the second with the cache the first one wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from tiny import write_tiny_gguf

pytestmark = pytest.mark.slow  # the first run compiles every cpu-fast kernel (~20 s)

# A 40-token prefill (blockwise attention: rows that see 32 keys or more), then one decode
# round next to a 3-token append (paged attention over 40 keys); logits of both rounds.
_FORWARD = """
import sys
import numpy as np
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.weights import build_weights

src = open_model(sys.argv[1])
spec = src.spec
dev = FastCpuDevice()
w = build_weights(spec, src.tensors, dev.upload)
kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 16, 16)
prompt = [int(t) for t in np.random.default_rng(0).integers(2, spec.vocab_size, 40)]
first = round_logits(spec, w, dev, kv, ForwardBatch.build([(prompt, 0, [0, 1, 2], True)], 16))
chunks = [([7], 40, [0, 1, 2], True), ([5, 6, 9], 0, [3], True)]
second = round_logits(spec, w, dev, kv, ForwardBatch.build(chunks, 16))
np.save(sys.argv[2], np.concatenate([first, second]))
"""


def _logits_in_fresh_process(model: Path, cache: Path, out: Path) -> np.ndarray:
    """The forward's logits [3, vocab] from a new interpreter whose numba cache is `cache`."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-c", _FORWARD, str(model), str(out)], env=env, check=True, timeout=600)
    return np.load(out)


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q8_0], ids=lambda q: q.name)
def test_first_run_and_cached_runs_give_identical_logits(tmp_path, qtype):
    """The logits of the run that compiled the kernels equal, bit for bit, those of a run
    that loaded them from the cache (head_dim 64, as SmolLM2's)."""
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype=qtype, hidden_size=256, num_attention_heads=4, head_dim=64)
    cache = tmp_path / "numba"
    compiled = _logits_in_fresh_process(model, cache, tmp_path / "first.npy")
    assert any(cache.rglob("*.nbi")), "the first run wrote no numba cache"
    loaded = _logits_in_fresh_process(model, cache, tmp_path / "second.npy")
    assert compiled.shape == loaded.shape == (3, compiled.shape[1])
    diff = np.flatnonzero((compiled != loaded).any(axis=1))
    assert diff.size == 0, f"rows {diff.tolist()} differ, by up to {np.abs(compiled - loaded).max():.3g}"
