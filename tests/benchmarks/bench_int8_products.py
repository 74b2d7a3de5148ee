"""The int8 products of one model's first layer against this host's vpdpbusd peak (not a test: run it as a script).

    python tests/benchmarks/bench_int8_products.py [--model qwen2.5-coder-0.5b] [--rows 512] [--threads 2]

Prints (1) the peak: a loop of nothing but independent vpdpbusd on registers, GMAC/s on 1
and on N threads (the ceiling no product can pass); (2) each matrix of layer 0 with an
int8 kernel: GMAC/s of `--rows` activation rows as cpu-fast multiplies them (outer
products for u5, k4 and u6 tasks of 32+ rows, kernels/cpu_fast/int8/ir_outer.py) and by the row
kernels alone (the same job table with its outer-product columns zeroed), each as a share
of the N-thread peak. Best of `--repeat`. Needs AVX512-VNNI (the peak loop is vpdpbusd).

On a CPU with AMX-INT8 (and the process permitted its tiles) it also prints the tiles' peak
(amx_ir.peak_ir: tdpbssd on 4 C tiles held in registers, 1 and N threads) and each
matrix on the tiles (kernels/cpu_fast/int8/amx_products.py), as a share of that peak.
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time

import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_ir
from zinfer.kernels.cpu_fast.int8 import ir as int8_ir
from zinfer.kernels.cpu_fast.int8 import row_driver
from zinfer.kernels.cpu_fast import llvm_host
from zinfer.models.loader import open_model

_ACCUMULATORS = 12  # independent chains: more than vpdpbusd's latency times its issue rate


def _peak_ir() -> str:
    """void peak(i64 n, ptr out): n iterations of 2 * _ACCUMULATORS vpdpbusd on registers."""
    vec = "<8 x i32>"
    lines = [f"declare {vec} @llvm.x86.avx512.vpdpbusd.256({vec}, {vec}, {vec})",
             "define void @peak(i64 %n, ptr %out) {", "entry:", "  br label %loop", "loop:",
             "  %i = phi i64 [ 0, %entry ], [ %in, %loop ]"]
    u, s = ("<i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 8>",
            "<i32 3, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7, i32 9>")
    for a in range(_ACCUMULATORS):
        lines.append(f"  %a{a} = phi {vec} [ zeroinitializer, %entry ], [ %b{a}, %loop ]")
    for a in range(_ACCUMULATORS):
        lines.append(f"  %c{a} = call {vec} @llvm.x86.avx512.vpdpbusd.256({vec} %a{a}, {vec} {u}, {vec} {s})")
        lines.append(f"  %b{a} = call {vec} @llvm.x86.avx512.vpdpbusd.256({vec} %c{a}, {vec} {s}, {vec} {u})")
    lines += ["  %in = add i64 %i, 1", "  %more = icmp ult i64 %in, %n",
              "  br i1 %more, label %loop, label %done", "done:"]
    total = "%b0"
    for a in range(1, _ACCUMULATORS):
        lines.append(f"  %t{a} = add {vec} {total}, %b{a}")
        total = f"%t{a}"
    lines += [f"  store {vec} {total}, ptr %out, align 1", "  ret void", "}"]
    return "\n".join(lines)


def peak_gmacs(threads: int, iterations: int = 20_000_000) -> float:
    """GMAC/s of the peak loop on `threads` threads at once (ctypes releases the GIL)."""
    fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(
        llvm_host.compile_for_host(_peak_ir(), ["peak"])["peak"])
    sink = (ctypes.c_int32 * 8)()
    best = float("inf")
    for _ in range(3):
        workers = [threading.Thread(target=fn, args=(iterations, ctypes.addressof(sink))) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return threads * iterations * 2 * _ACCUMULATORS * 32 / best / 1e9


def _threads_rate(fn, threads: int, per_thread_macs: float) -> float:
    """GMAC/s of fn() run on `threads` threads at once (ctypes releases the GIL), best of 3."""
    best = float("inf")
    for _ in range(3):
        workers = [threading.Thread(target=fn) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return threads * per_thread_macs / best / 1e9


def amx_peak_gmacs(threads: int, iterations: int = 500_000) -> float:
    """GMAC/s of the AMX peak loop (amx_ir.peak_ir) on `threads` threads at once."""
    fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(
        llvm_host.compile_for_host(amx_ir.peak_ir(), ["amx_peak"])["amx_peak"])
    scratch = [np.zeros(8192, np.uint8) for _ in range(threads)]
    calls = iter(scratch * 3)
    return _threads_rate(lambda: fn(iterations, next(calls).ctypes.data), threads,
                         iterations * amx_ir.PEAK_MACS_PER_ITERATION)


def _best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rows", type=int, default=512, help="activation rows of each product")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    if int8_ir.host_isa() != "vnni":
        raise SystemExit("needs AVX512-VNNI (the peak loop is vpdpbusd)")
    one, peak = peak_gmacs(1), peak_gmacs(args.threads)
    print(f"vpdpbusd peak: {one:.1f} GMAC/s on 1 thread, {peak:.1f} on {args.threads}")
    amx = amx_host.tiles_permitted()
    amx_peak = amx_peak_gmacs(args.threads) if amx else 0.0
    if amx:
        print(f"AMX tdpbssd peak: {amx_peak_gmacs(1):.1f} GMAC/s on 1 thread, {amx_peak:.1f} on {args.threads}")
    src = open_model(args.model)
    dev = FastCpuDevice(threads=args.threads)
    amx_head = "   AMX GMAC/s (% AMX peak)" if amx else ""
    print(f"{'matrix':28} {'type':6} {'kind':4} {'shape':>12}   outer GMAC/s (% peak)   rows only (% peak){amx_head}")
    for name, tensor in sorted(src.tensors.items()):
        if not name.startswith("blk.0.") or len(tensor.shape) != 2:
            continue
        w = dev.upload(name, tensor)
        if getattr(w, "int8", None) is None:
            continue
        tiles = ci.jobs_for([w.int8])
        jobs = tiles._replace(amx=None)  # the VNNI kernels alone
        rows_only = ci.Jobs(jobs.weights, jobs.table.copy(), jobs.bounds)
        rows_only.table[:, row_driver.JOB_COLUMNS - 3 :] = 0  # no outer-product kernels: every task on the row kernels
        x = np.random.default_rng(0).standard_normal((args.rows, w.shape[1]), dtype=np.float32)
        macs = args.rows * w.shape[0] * w.shape[1] / 1e9
        rates = [macs / _best(lambda j=j: ci.matmul_many(j, x), args.repeat) for j in (jobs, rows_only)]
        cells = "   ".join(f"{r:7.1f} ({100 * r / peak:4.1f}%)" for r in rates)
        if amx and tiles.amx is not None:
            rate = macs / _best(lambda: ci.matmul_many(tiles, x), args.repeat)
            cells += f"   {rate:7.1f} ({100 * rate / amx_peak:4.1f}%)"
        print(f"{name:28} {QT(tensor.qtype).name:6} {w.int8.kind:4} {str(tuple(w.shape)):>12}   {cells}")


if __name__ == "__main__":
    main()
