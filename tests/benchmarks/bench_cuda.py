"""Decode and prefill speed of the CUDA device on synthetic Llama-shaped models.

Run on a GPU machine:  python tests/benchmarks/bench_cuda.py [--models 1b,8b] [--quick]

Weights are random (GGUF Q4_K blocks with sane scales, or bf16 ~ N(0, 0.02)) built
directly on the GPU: nothing is written to disk. Each row prints tokens/s with the
achieved memory bandwidth (weights + KV read per round) next to the H200's ~4.3 TB/s,
and prefill adds GFLOP/s. Needs only numpy and cupy (gguf / msgspec are stubbed when
missing; the zinfer namespace is mapped onto this checkout when not installed).
Not a pytest module (no test_ prefix).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import types
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
PEAK_GBS = 4300.0  # H200 HBM3e, GB/s


def _import_setup() -> None:
    """Make `zinfer.*` importable from this checkout, with stubs for gguf / msgspec if absent."""
    if importlib.util.find_spec("gguf") is None:
        sys.modules["gguf"] = types.ModuleType("gguf")  # gguf_file only needs the name at import
    if importlib.util.find_spec("msgspec") is None:
        import dataclasses

        ms = types.ModuleType("msgspec")

        class Struct:
            def __init_subclass__(cls, frozen: bool = False, **_):
                dataclasses.dataclass(frozen=frozen)(cls)

        ms.Struct = Struct
        sys.modules["msgspec"] = ms
    try:
        import zinfer.devices  # noqa: F401
    except ImportError:
        pkg = types.ModuleType("zinfer")
        pkg.__path__ = []
        sys.modules["zinfer"] = pkg
        for sub in ("devices", "kernels", "models"):
            m = types.ModuleType(f"zinfer.{sub}")
            m.__path__ = [str(ROOT / sub)]
            sys.modules[f"zinfer.{sub}"] = m


_import_setup()
import cupy as cp  # noqa: E402

from zinfer.devices.cuda import CudaConfig, CudaDevice, GpuMatrix  # noqa: E402
from zinfer.devices.batch import ForwardBatch  # noqa: E402
from zinfer.models.forward import round_logits  # noqa: E402
from zinfer.models.spec import ModelSpec  # noqa: E402
from zinfer.models.weights import LayerWeights, ModelWeights  # noqa: E402

SHAPES = {  # d, layers, heads, kv heads, head dim, ffn, vocab
    "1b": (2048, 16, 32, 8, 64, 8192, 128256),
    "8b": (4096, 32, 32, 8, 128, 14336, 128256),
}
Q4_K, BF16 = 12, 30


def make_spec(name: str) -> ModelSpec:
    d, L, H, Hkv, hd, ff, V = SHAPES[name]
    return ModelSpec(arch="llama", n_layers=L, d_model=d, n_heads=H, n_kv_heads=Hkv, head_dim=hd, d_ff=ff,
                     vocab_size=V, context_length=8192, rms_eps=1e-5, rope_base=500000.0, rope_dim=hd,
                     rope_interleaved=True, attn_scale=hd ** -0.5)


def matrix(qtype: int, rows: int, cols: int) -> GpuMatrix:
    if qtype == BF16:
        f = cp.random.standard_normal((rows, cols), dtype=cp.float32) * 0.02
        data = (f.view(cp.uint32) >> 16).astype(cp.uint16).view(cp.uint8).reshape(rows, cols * 2)
        return GpuMatrix(BF16, rows, cols, data, cols * 2)
    nb = cols // 256
    data = cp.random.randint(0, 256, (rows, nb, 144), dtype=cp.uint8)
    scales = cp.full((rows, nb, 2), 0.0005, cp.float16).view(cp.uint8)  # d, dmin ~ 5e-4
    data[:, :, 0:4] = scales.reshape(rows, nb, 4)
    return GpuMatrix(Q4_K, rows, cols, data.reshape(rows, nb * 144), nb * 144)


def make_weights(spec: ModelSpec, qtype: int) -> ModelWeights:
    d, ff, qd, kvd = spec.d_model, spec.d_ff, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    ones = lambda n: cp.ones(n, cp.float32)  # noqa: E731
    layers = [LayerWeights(attn_norm=ones(d), wq=matrix(qtype, qd, d), wk=matrix(qtype, kvd, d),
                           wv=matrix(qtype, kvd, d), wo=matrix(qtype, d, qd), ffn_norm=ones(d),
                           w_gate=matrix(qtype, ff, d), w_up=matrix(qtype, ff, d), w_down=matrix(qtype, d, ff))
              for _ in range(spec.n_layers)]
    emb = matrix(qtype, spec.vocab_size, d)
    return ModelWeights(tok_embd=emb, out_norm=ones(d), output=matrix(qtype, spec.vocab_size, d), layers=layers)


def weight_bytes(w: ModelWeights) -> int:
    """Bytes a round streams: every layer matrix and the LM head (not the embedding table)."""
    mats = [m for lw in w.layers for m in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down)] + [w.output]
    return sum(m.nbytes for m in mats)


def timed(fn, n: int) -> float:
    """Seconds per call of fn (which ends in a device->host copy) after 2 warm-up calls."""
    for _ in range(2):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / n


def bench_model(name: str, qtype: int, ctx: int, batches: list[int], prefill_len: int, rows: list[str]) -> None:
    spec = make_spec(name)
    w = make_weights(spec, qtype)
    wb = weight_bytes(w)
    n_params = wb / (0.5625 if qtype == Q4_K else 2.0)
    bs = 16
    kv_tok = spec.n_layers * spec.n_kv_heads * spec.head_dim * 4 * 2  # f32 K+V bytes per token
    qname = "Q4_K" if qtype == Q4_K else "bf16"
    for graphs in (False, True):
        dev = CudaDevice(0, CudaConfig(cuda_graphs=graphs))
        for B in batches:
            blocks = -(-(ctx + 16) // bs)
            kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, B * blocks, bs)
            chunks = [([7], ctx - 1, list(range(i * blocks, (i + 1) * blocks)), True) for i in range(B)]
            batch = ForwardBatch.build(chunks, bs)
            sec = timed(lambda: round_logits(spec, w, dev, kv, batch), 10)
            gbs = (wb + B * ctx * kv_tok) / sec / 1e9
            rows.append(f"{name:>3} {qname:>5} decode  B={B:<3} ctx={ctx:<5} graphs={'on ' if graphs else 'off'} "
                        f"{B / sec:10.1f} tok/s  {sec * 1e3:8.2f} ms/round  "
                        f"{gbs:7.0f} GB/s ({100 * gbs / PEAK_GBS:4.1f}% of {PEAK_GBS:.0f})")
            print(rows[-1], flush=True)
            del kv
    for gemm in ("f32", "f16"):
        dev = CudaDevice(0, CudaConfig(gemm_dtype=gemm))
        blocks = -(-prefill_len // bs)
        kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, blocks, bs)
        batch = ForwardBatch.build([(list(range(3, 3 + prefill_len)), 0, list(range(blocks)), True)], bs)
        sec = timed(lambda: round_logits(spec, w, dev, kv, batch), 3)
        gbs, tflops = wb / sec / 1e9, 2 * n_params * prefill_len / sec / 1e12
        rows.append(f"{name:>3} {qname:>5} prefill T={prefill_len:<5} gemm={gemm}         "
                    f"{prefill_len / sec:10.1f} tok/s  "
                    f"{sec * 1e3:8.2f} ms/round  {gbs:7.0f} GB/s ({100 * gbs / PEAK_GBS:4.1f}%)  {tflops:6.1f} TFLOP/s")
        print(rows[-1], flush=True)
        del kv
    del w
    cp.get_default_memory_pool().free_all_blocks()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1b,8b")
    ap.add_argument("--types", default="q4_k,bf16")
    ap.add_argument("--ctx", type=int, default=512, help="context length of decode rounds")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="batches 1 and 8 only")
    args = ap.parse_args()
    batches = [1, 8] if args.quick else [1, 8, 64]
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}  cupy {cp.__version__}", flush=True)
    rows: list[str] = []
    t0 = time.perf_counter()
    for name in args.models.split(","):
        for t in args.types.split(","):
            bench_model(name, Q4_K if t == "q4_k" else BF16, args.ctx, batches, args.prefill, rows)
    print("\n=== summary (GB/s = weights + KV bytes per round / time; H200 peak ~4300 GB/s) ===")
    print("\n".join(rows))
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
