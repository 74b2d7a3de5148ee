"""The CUDA device against the numpy oracle: every kernel on random inputs of several
shapes, and greedy tokens of tiny models equal on cuda and cpu (eager and CUDA graphs).

Skips as a whole, with the reason shown, where cupy or a CUDA GPU is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

try:
    import cupy

    _GPU = bool(cupy.cuda.is_available())
except Exception:  # not installed, or no driver
    cupy, _GPU = None, False

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _GPU, reason="no CUDA GPU (cupy missing or cupy.cuda.is_available() is False)")]

from zinfer.devices.cpu import CpuDevice, CpuKV  # noqa: E402
from zinfer.devices.cuda import CudaConfig, CudaDevice  # noqa: E402
from zinfer.kernels.oracle import reference as ref  # noqa: E402
from zinfer.kernels.oracle.quants import BLOCK_SHAPES, dequantize  # noqa: E402
from zinfer.devices.batch import ForwardBatch  # noqa: E402
from zinfer.kernels.tensor import TensorData  # noqa: E402

# ggml type ids: the kernel types
TYPES = {"F16": 1, "BF16": 30, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
SCALE_OFFSETS = {2: [0], 3: [0, 2], 6: [0], 8: [0], 12: [0, 2], 14: [208]}  # fp16 d / m / dmin fields


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a) - b).max() / max(np.abs(b).max(), 1e-30))


def random_tensor(qtype: int, rows: int, cols: int, rng) -> TensorData:
    """Random raw blocks with sane fp16 scales (~0.01), or random f16/bf16 values."""
    if qtype == 1:
        return TensorData(qtype, (rows, cols), rng.standard_normal((rows, cols)).astype(np.float16))
    if qtype == 30:
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        return TensorData(qtype, (rows, cols), (f.view(np.uint32) >> 16).astype(np.uint16))
    epb, bpb = BLOCK_SHAPES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // epb, bpb), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        blocks[:, off:off + 2] = (rng.uniform(0.005, 0.02, blocks.shape[0])
                                  .astype(np.float16)).view(np.uint8).reshape(-1, 2)
    return TensorData(qtype, (rows, cols), blocks.reshape(rows, -1))


@pytest.fixture(scope="module")
def dev():
    return CudaDevice(0)


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("rows,cols", [(64, 256), (100, 512), (33, 1024)])
@pytest.mark.parametrize("T", [1, 3, 8, 13, 80])
def test_linear_matches_dequantized_matmul(dev, name, rows, cols, T):
    rng = np.random.default_rng(rows + cols + T)
    t = random_tensor(TYPES[name], rows, cols, rng)
    w = dequantize(t.data, t.qtype, t.shape)  # [rows, cols]
    x = rng.standard_normal((T, cols)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    y = dev.to_numpy(dev.linear(dev.from_numpy(x), dev.upload("w", t), dev.from_numpy(b)))
    assert y.shape == (T, rows)
    assert rel_err(y, ref.linear(x, w, b)) < 1e-4


@pytest.mark.parametrize("name", list(TYPES))
def test_embed_rows_equal_dequantized_rows(dev, name):
    rng = np.random.default_rng(1)
    t = random_tensor(TYPES[name], 50, 256, rng)
    ids = np.array([0, 7, 49, 7, 3], np.int64)
    got = dev.to_numpy(dev.embed(dev.upload("tok_embd", t), ids))
    np.testing.assert_array_equal(got, dequantize(t.data, t.qtype, t.shape)[ids])


@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 16), (2, 576), (1, 4096)])
def test_rms_norm(dev, shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    got = dev.to_numpy(dev.rms_norm(dev.from_numpy(x), dev.from_numpy(w), 1e-6))
    assert rel_err(got, ref.rms_norm(x, w, 1e-6)) < 1e-5


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("T,heads,hd,rope_dim", [(7, 4, 16, 16), (3, 2, 64, 32), (5, 8, 128, 128)])
def test_rope(dev, interleaved, T, heads, hd, rope_dim):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, heads, hd)).astype(np.float32)
    pos = rng.integers(0, 4000, T).astype(np.int64)
    # a round at these positions
    ctx = dev.begin_round(ForwardBatch.build([([0], int(p), [0], False) for p in pos], 4096))
    got = dev.to_numpy(dev.rope(dev.from_numpy(x), ctx, 10000.0, rope_dim, interleaved))
    assert rel_err(got, ref.rope(x, pos, 10000.0, rope_dim, interleaved)) < 1e-4


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu(dev, act):
    rng = np.random.default_rng(4)
    g, u = (rng.standard_normal((9, 300)).astype(np.float32) * 4 for _ in range(2))
    got = dev.to_numpy(dev.glu(dev.from_numpy(g), dev.from_numpy(u), act))
    assert rel_err(got, ref.glu(g, u, act)) < 1e-5


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("H,Hkv,hd", [(4, 2, 16), (8, 1, 64), (6, 6, 128), (2, 1, 256)])
def test_paged_attention_matches_cpu(dev, window, H, Hkv, hd):
    """Decode, prefill and append-prefill sequences in one round, over shuffled blocks."""
    rng = np.random.default_rng(H * hd + window)
    bs, n_blocks = 4, 40
    perm = [int(b) for b in rng.permutation(n_blocks)]
    # (new tokens, first position): a decode step, a fresh 37-token prefill, a 6-token append
    shapes = [(1, 9), (37, 0), (6, 11)]
    chunks, used = [], 0
    for n, first in shapes:
        need = -(-(first + n) // bs)
        chunks.append((list(range(n)), first, perm[used:used + need], True))
        used += need
    batch = ForwardBatch.build(chunks, bs)
    cpu, cpu_kv = CpuDevice(), CpuKV([np.zeros(((n_blocks) * bs, Hkv, hd), np.float32)],
                                     [np.zeros(((n_blocks) * bs, Hkv, hd), np.float32)], n_blocks, bs)
    gpu_kv = dev.alloc_kv(1, Hkv, hd, n_blocks, bs)
    # earlier context of every sequence (every slot of the pool), then this round's K/V
    k0, v0 = (rng.standard_normal((n_blocks * bs, Hkv, hd)).astype(np.float32) for _ in range(2))
    cpu_kv.k[0][:], cpu_kv.v[0][:] = k0, v0
    gpu_kv.k[0][:n_blocks * bs], gpu_kv.v[0][:n_blocks * bs] = dev.from_numpy(k0), dev.from_numpy(v0)
    T = batch.n_tokens
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k, v = (rng.standard_normal((T, Hkv, hd)).astype(np.float32) for _ in range(2))
    scale = hd ** -0.5
    cpu_ctx, gpu_ctx = cpu.begin_round(batch), dev.begin_round(batch)
    cpu.write_kv(cpu_kv, 0, k, v, cpu_ctx)
    want = cpu.attention(q, cpu_kv, 0, cpu_ctx, scale, window)
    dev.write_kv(gpu_kv, 0, dev.from_numpy(k), dev.from_numpy(v), gpu_ctx)
    got = dev.to_numpy(dev.attention(dev.from_numpy(q), gpu_kv, 0, gpu_ctx, scale, window))
    assert rel_err(got, want) < 1e-4


@pytest.mark.parametrize("R,V,k", [(1, 1000, 1), (3, 50000, 5), (4, 151936, 40)])
def test_topk_matches_stable_sort(dev, R, V, k):
    rng = np.random.default_rng(V)
    logits = rng.standard_normal((R, V)).astype(np.float32)
    logits[0, 10] = logits[0, 3] = 50.0  # a tie: the lower id first
    ids, vals = dev.topk(dev.from_numpy(logits), k)
    want = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_array_equal(vals, np.take_along_axis(logits, want, 1))


# ---- whole tiny models: greedy tokens equal on cuda and cpu ----

def _greedy(round_of, prompt: list[int], n_new: int, bs: int = 8) -> list[int]:
    """Greedy ids: a prefill of prompt, then one-token decode rounds; round_of(batch) -> logits."""
    table = list(range(16))
    logits = round_of(ForwardBatch.build([(prompt, 0, table, True)], bs))
    out = [int(np.argmax(logits[0]))]
    for _ in range(n_new - 1):
        logits = round_of(ForwardBatch.build([([out[-1]], len(prompt) + len(out) - 1, table, True)], bs))
        out.append(int(np.argmax(logits[0])))
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("graphs", [False, True])
def test_tiny_model_greedy_tokens_equal_cpu(tmp_path, arch, qtype, graphs):
    from gguf import GGMLQuantizationType as QT

    from zinfer.models.forward import round_logits
    from zinfer.models.loader import open_model
    from tiny import write_tiny_gguf
    from zinfer.models.weights import build_weights

    src = open_model(write_tiny_gguf(tmp_path / "m.gguf", arch, seed=3, qtype=QT[qtype]))
    spec = src.spec
    cpu = CpuDevice()
    gpu = CudaDevice(0, CudaConfig(cuda_graphs=graphs))
    w_cpu = build_weights(spec, src.tensors, cpu.upload)
    w_gpu = build_weights(spec, src.tensors, gpu.upload)
    prompt = [5, 40, 77, 120, 9, 33, 250, 17, 64, 3]
    kv_cpu = cpu.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 16, 8)
    kv_gpu = gpu.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 16, 8)
    want = _greedy(lambda b: round_logits(spec, w_cpu, cpu, kv_cpu, b), prompt, 12)
    # run_round: graphs replay decode rounds
    got = _greedy(lambda b: round_logits(spec, w_gpu, gpu, kv_gpu, b), prompt, 12)
    assert got == want


@pytest.mark.parametrize("graphs", [False, True])
def test_traced_rounds_read_cuda_events_and_keep_graphs(tmp_path, graphs):
    """The executor's traced path: ops through the kernel-timing wrapper on the device's
    kernel_clock (CUDA events), rounds through run_round (graphs replay decode rounds,
    which time no kernels); the logits are the untraced ones."""
    from zinfer.models.forward import round_logits
    from zinfer.models.loader import open_model
    from tiny import write_tiny_gguf
    from zinfer.models.weights import build_weights
    from zinfer.devices.cuda_clock import CudaEventClock
    from zinfer.traces.kernels import KernelRecorder

    src = open_model(write_tiny_gguf(tmp_path / "m.gguf", "llama", seed=3))
    spec = src.spec
    gpu = CudaDevice(0, CudaConfig(cuda_graphs=graphs))
    clock = gpu.kernel_clock()
    assert isinstance(clock, CudaEventClock)
    rec = KernelRecorder(clock)
    traced = rec.wrap(gpu)
    w = build_weights(spec, src.tensors, gpu.upload)
    kv = gpu.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 16, 8)
    table = list(range(16))
    prompt = [5, 40, 77, 120, 9, 33]
    plain = round_logits(spec, w, gpu, kv, ForwardBatch.build([(prompt, 0, table, True)], 8))
    got = round_logits(spec, w, traced, kv, ForwardBatch.build([(prompt, 0, table, True)], 8), marks=rec)
    assert rel_err(got, plain) < 1e-6
    offset, events = rec.take()
    assert offset > 0 and {"embed", "attention", "layer 0"} <= {name for name, _, _ in events}
    assert all(0 <= a <= b for _, a, b in events)
    for step in range(3):  # decode rounds: with graphs, the first captures and the others replay
        decode = ForwardBatch.build([([7], len(prompt) + step, table, True)], 8)
        round_logits(spec, w, traced, kv, decode, marks=rec)
        _, events = rec.take()
        if graphs and step > 0:
            assert events == []  # a replay runs no op through the wrapper
        else:
            assert events and all(0 <= a <= b for _, a, b in events)
