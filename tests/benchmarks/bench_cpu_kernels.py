"""Fast CPU device vs llama.cpp, side by side in one run (not a test: run it as a script).

    python tests/benchmarks/bench_cpu_kernels.py [--threads 2] [--model PATH] [--skip-llama]

Prints (1) the linear crossover: int8 kernel, float quantized kernel, BLAS on an f32
copy and BLAS on tiles dequantized per call, by batch rows; (2) SmolLM2 prefill of 512 tokens, decode
at batch 1, and aggregate greedy decode of 16 and 64 sequences, tok/s and weight GB/s
for FastCpuDevice and llama.cpp with the same thread count. Best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from zinfer.devices import cpu_fast, cpu_fast_linears
from zinfer.devices.cpu_fast_linears import QuantLinear
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.gateway.bench_llama import LlamaContext, LlamaModel
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast import cpu_quant as cq
from zinfer.devices.batch import ForwardBatch
from zinfer.models.forward import round_logits
from zinfer.models.loader import open_model
from zinfer.models.weights import build_weights

BLOCK = 16


def best(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def crossover(src, repeat: int) -> None:
    t = src.tensors["blk.0.ffn_up.weight"]
    w8 = FastCpuDevice().upload("up", t)  # int8 kernels (where VNNI): no f32 copy
    dev = FastCpuDevice(int8=False)
    w = dev.upload("up", t)
    nocopy = QuantLinear(w.shape, w.packed, None)  # BLAS on tiles dequantized per call
    print(f"\nlinear {t.qtype.name} {w.shape}: int8 (VNNI) and float quantized kernels vs BLAS (us)")
    print("  T    int8   quant   f32-copy   deq-tiles")
    for T in (1, 2, 4, 8, 12, 16, 32, 64, 128, 256, 512):
        x = np.random.default_rng(0).standard_normal((T, w.shape[1]), dtype=np.float32)
        out = np.empty((T, w.shape[0]), np.float32)
        jobs = ci.jobs_for([w8.int8]) if w8.int8 is not None else None
        i8 = best(lambda: ci.matmul_many(jobs, x), repeat * 5) if jobs else float("nan")
        q = best(lambda: cq.matmul(w.packed, x, out), repeat * 5)
        f = best(lambda: x @ w.f32.T, repeat * 5)
        saved = cpu_fast_linears.SMALL_BATCH_NO_COPY
        cpu_fast_linears.SMALL_BATCH_NO_COPY = 0
        d = best(lambda: dev.linear(x, nocopy), repeat * 5)
        cpu_fast_linears.SMALL_BATCH_NO_COPY = saved
        print(f"{T:4d} {i8*1e6:7.0f} {q*1e6:7.0f} {f*1e6:10.0f} {d*1e6:11.0f}")


class Ours:
    def __init__(self, src, threads: int):
        self.spec = src.spec
        self.dev = FastCpuDevice(threads=threads)
        self.w = build_weights(self.spec, src.tensors, self.dev.upload)
        mats = [v for lw in self.w.layers for v in vars(lw).values() if isinstance(v, cpu_fast.FastWeight)]
        self.q_bytes = sum((m.int8 or m.packed).nbytes for m in mats + [self.w.output])  # what small rounds read
        self.gguf_bytes = sum(t.data.nbytes for n, t in src.tensors.items()
                              if n.startswith("blk.") and len(t.shape) == 2)
        self.gguf_bytes += (src.tensors.get("output.weight") or src.tensors["token_embd.weight"]).data.nbytes
        # its quantized form (int8 view or packed)
        self.f32_bytes = sum(m.shape[0] * m.shape[1] * 4 for m in mats) + self.w.output.nbytes

    def run(self, seqs: list[list[int]], steps: int) -> float:
        """Prefill each prompt (one round), then `steps` greedy decode rounds; returns seconds of decode."""
        n_blocks = -(-(max(map(len, seqs)) + steps + 1) // BLOCK)
        kv = self.dev.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim,
                               n_blocks * len(seqs), BLOCK)
        tables = [list(range(i * n_blocks, (i + 1) * n_blocks)) for i in range(len(seqs))]
        logits = round_logits(self.spec, self.w, self.dev, kv,
                              ForwardBatch.build([(s, 0, t, True) for s, t in zip(seqs, tables)], BLOCK))
        pos = [len(s) for s in seqs]
        t0 = time.perf_counter()
        for _ in range(steps):
            nxt = logits.argmax(axis=1)
            b = ForwardBatch.build([([int(n)], p, t, True) for n, p, t in zip(nxt, pos, tables)], BLOCK)
            logits = round_logits(self.spec, self.w, self.dev, kv, b)
            pos = [p + 1 for p in pos]
        return time.perf_counter() - t0

    def prefill(self, ids: list[int]) -> float:
        kv = self.dev.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim,
                               -(-len(ids) // BLOCK), BLOCK)
        b = ForwardBatch.build([(ids, 0, list(range(kv.num_blocks)), True)], BLOCK)
        t0 = time.perf_counter()
        round_logits(self.spec, self.w, self.dev, kv, b)
        return time.perf_counter() - t0


class Llama:
    """llama.cpp's side: the batch-API wrapper `zinfer bench --compare-llama-cpp` uses."""

    def __init__(self, path: str, threads: int, n_ctx: int, n_seq: int):
        self.model = LlamaModel(path)
        self.threads, self.seq_len, self.contexts = threads, n_ctx // n_seq, {}

    def _context(self, n_seq: int) -> LlamaContext:
        """A context of n_seq sequences, each in its own KV stream, made once."""
        if n_seq not in self.contexts:
            self.contexts[n_seq] = LlamaContext(self.model, n_seq, max(self.seq_len, 600), self.threads, unified=False)
        return self.contexts[n_seq]

    def prefill(self, ids: list[int]) -> float:
        start, streams = self._context(1).generate([ids], 1)
        return streams[0][0] - start

    def run(self, seqs: list[list[int]], steps: int) -> float:
        """Seconds of `steps` decode rounds after the prompts' prefill."""
        _, streams = self._context(len(seqs)).generate(seqs, steps + 1)
        return streams[0][-1] - max(s[0] for s in streams)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--skip-crossover", action="store_true")
    args = ap.parse_args()
    src = open_model(args.model)
    t0 = time.perf_counter()
    ours = Ours(src, args.threads)
    ours.prefill(list(range(1, 40)))  # first call: compiles, or loads the numba cache
    ours.run([[1, 2, 3]], 1)
    ours.run([[1, 2, 3]] * 16, 1)
    print(f"start-up incl. numba compile/cache load: {time.perf_counter() - t0:.1f}s")
    if not args.skip_crossover:
        crossover(src, args.repeat)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 40000, 512)]
    llama = None if args.skip_llama else Llama(args.model, args.threads, 4096, 64)
    rows = []
    sides = [("zinfer", ours)] + ([("llama.cpp", llama)] if llama else [])
    s = {name: best(lambda: side.prefill(prompt), args.repeat) for name, side in sides}
    rows.append(("prefill 512", {k: 512 / v for k, v in s.items()}, None))
    for n_seq in (1, 16, 64):
        seqs = [[int(t) for t in rng.integers(100, 40000, 16)] for _ in range(n_seq)]
        s = {name: best(lambda: side.run(seqs, args.steps), args.repeat) for name, side in sides}
        rows.append((f"decode x{n_seq}", {k: n_seq * args.steps / v for k, v in s.items()}, n_seq))
        print(rows[-1][0], {k: round(v, 1) for k, v in rows[-1][1].items()}, flush=True)
    print(f"\nthreads={args.threads}  weights/token: quantized {ours.q_bytes / 1e6:.0f} MB "
          f"(llama.cpp {ours.gguf_bytes / 1e6:.0f} MB), f32-copy path {ours.f32_bytes / 1e6:.0f} MB")
    print(f"{'case':14s} {'zinfer tok/s':>13s} {'llama tok/s':>12s} {'ratio':>6s} "
          f"{'zinfer GB/s':>12s} {'llama GB/s':>11s}")
    for case, tps, n_seq in rows:
        z, l = tps["zinfer"], tps.get("llama.cpp", float("nan"))
        gz = gl = ""
        if n_seq:
            per_round = ours.q_bytes if ours.dev.int8 or n_seq <= cpu_fast.SMALL_BATCH else ours.f32_bytes
            gz = f"{per_round * z / n_seq / 1e9:.1f}"
            gl = f"{ours.gguf_bytes * l / n_seq / 1e9:.1f}"
        print(f"{case:14s} {z:13.1f} {l:12.1f} {z / l:6.2f} {gz:>12s} {gl:>11s}")


if __name__ == "__main__":
    main()
