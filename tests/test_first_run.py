"""cpu-fast computes the same numbers on its first run, which fills numba's cache, as on
every later run, which loads it (#16; kernels/cpu_fast/compile_cache.py).

numba runs code it has just compiled differently from the same code loaded from its
cache (a parallel kernel's body from its own module, against the caller's re-optimized
copy), and fastmath rounds the two differently. So kernels missing from the cache are
compiled by a helper process and loaded from the cache here, and a first run is a
later run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from structlog.testing import capture_logs

from tiny import write_tiny_gguf
from zinfer.kernels.cpu_fast import compile_cache

_PROBE = '''
from numba import njit


@njit(cache=True)
def scaled_sum(x, k):
    total = 0.0
    for v in x:
        total += v * k
    return total
'''


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A fresh module of one cached numba kernel, routed like zinfer's kernels, with an
    empty numba cache and no helper yet; the helper it starts is closed afterwards."""
    name = f"probe_kernels_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba"))
    monkeypatch.setattr(compile_cache, "KERNEL_MODULES", name)
    monkeypatch.setattr(compile_cache, "_helper", None)
    monkeypatch.setattr(compile_cache, "_helper_broken", False)
    compile_cache.route_compiles()  # as a cpu-fast device does when built
    __import__(name)
    yield sys.modules.pop(name).scaled_sum
    if compile_cache._helper is not None:
        compile_cache._helper.close()


def test_a_kernel_missing_from_the_cache_is_compiled_by_the_helper_and_loaded_from_the_cache(probe, capfd):
    """The first call's kernel comes from the cache (a hit, never compiled here), the
    helper having announced itself once on stderr; a second signature reuses it."""
    assert probe(np.arange(4.0), 2.0) == 12.0
    assert probe(np.arange(3, dtype=np.int64), 3) == 9
    stats = probe.stats
    assert sum(stats.cache_misses.values()) == 0, "this process compiled the kernel itself"
    assert sum(stats.cache_hits.values()) == 2
    assert capfd.readouterr().err.count(compile_cache.FIRST_COMPILE_NOTE) == 1


def test_a_helper_that_cannot_start_leaves_the_compile_to_this_process_with_a_warning(probe, monkeypatch):
    """No helper (its python is missing): the kernel still compiles and runs, here, warned."""
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    with capture_logs() as logs:
        assert probe(np.arange(4.0), 2.0) == 12.0
        assert probe(np.arange(3, dtype=np.int64), 3) == 9
    assert sum(probe.stats.cache_misses.values()) == 2
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert len(warned) == 1 and "compiled in this process" in warned[0]["event"]


def test_a_kernel_the_helper_fails_on_is_compiled_by_this_process_with_a_warning(probe, monkeypatch):
    """The helper cannot import the kernel's module (no PYTHONPATH to it): warned, compiled here."""
    monkeypatch.delenv("PYTHONPATH")
    with capture_logs() as logs:
        assert probe(np.arange(4.0), 2.0) == 12.0
    assert sum(probe.stats.cache_misses.values()) == 1
    assert any("ModuleNotFoundError" in e.get("error", "") for e in logs if e["log_level"] == "warning")


# A 40-token prefill (blockwise attention: rows that see 32 keys or more), then one decode
# round next to a 3-token append (paged attention over 40 keys); the logits of both
# rounds, and how many kernel signatures this process compiled itself.
_FORWARD = """
import sys
import numpy as np
from numba.core.dispatcher import Dispatcher
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
kernels = [v for name, m in list(sys.modules.items()) if name.startswith("zinfer.kernels.") \
for v in vars(m).values() if isinstance(v, Dispatcher)]
print("compiled here:", sum(sum(k.stats.cache_misses.values()) for k in kernels))
"""


def _run(model: Path, cache: Path, out: Path) -> tuple[np.ndarray, subprocess.CompletedProcess]:
    """The forward's logits [3, vocab] from a new interpreter whose numba cache is `cache`."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    env.pop(compile_cache.IN_PROCESS_ENV, None)
    done = subprocess.run([sys.executable, "-c", _FORWARD, str(model), str(out)], env=env, check=True, timeout=600,
                          capture_output=True, text=True)
    return np.load(out), done


@pytest.mark.slow  # the first run compiles every kernel it uses (~25 s of CPU)
def test_the_first_cpu_fast_run_gives_the_logits_of_every_later_run(tmp_path):
    """Logits of the run that filled an empty cache equal, bit for bit, those of a run
    that loaded it (head_dim 64 as SmolLM2's; before the fix rows 0 and 1 differed by
    0.055). Neither run compiles a kernel in its own process, and only the first says it
    compiles."""
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype=QT.Q4_1, hidden_size=256, num_attention_heads=4,
                            head_dim=64)
    cache = tmp_path / "numba"
    first, first_run = _run(model, cache, tmp_path / "first.npy")
    later, later_run = _run(model, cache, tmp_path / "later.npy")
    assert first.shape == later.shape == (3, first.shape[1])
    differ = np.flatnonzero((first != later).any(axis=1))
    assert differ.size == 0, f"rows {differ.tolist()} differ, by up to {np.abs(first - later).max():.3g}"
    assert "compiled here: 0" in first_run.stdout and "compiled here: 0" in later_run.stdout
    assert compile_cache.FIRST_COMPILE_NOTE in first_run.stderr
    assert compile_cache.FIRST_COMPILE_NOTE not in later_run.stderr
