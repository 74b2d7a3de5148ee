"""Start-up of `zinfer run` beside llama.cpp's load and first token, and both peak RSS
(not a test: run it as a script; needs llama-cpp-python).

    python tests/benchmarks/bench_startup.py [--model qwen2.5-coder-1.5b] [--threads 2] [--runs 3]

zinfer: `zinfer run` as a user types it, timed from process start to the first byte of
its streamed answer, and the peak RSS of that process (wait4). llama.cpp: in a process
of its own, from the call that loads the model to the first streamed token of the same
chat question (llama-cpp-python's `Llama` with its defaults: weight repacking on, f16 KV),
with the same context length and threads, and that process's peak RSS. zinfer's Python
start and imports count; llama-cpp-python's do not. Both from a warm cache: one untimed
run of each first reads the file into the page cache (and fills zinfer's caches).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

QUESTION = "Write a Python function that returns the n-th Fibonacci number."

LLAMA_CHILD = """
import json, sys, time
from llama_cpp import Llama
path, threads, n_ctx, question = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
loaded = time.perf_counter() - t0
stream = llm.create_chat_completion([{"role": "user", "content": question}], max_tokens=8, temperature=0, stream=True)
for chunk in stream:
    if chunk["choices"][0]["delta"].get("content"):
        break
print(json.dumps({"load_s": loaded, "first_token_s": time.perf_counter() - t0}))
"""


def run_child(argv: list[str]) -> tuple[float, bytes, int]:
    """(seconds from start to argv's first byte on stdout, all of its stdout, its peak RSS
    in bytes) of one run of argv; raises if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.read(1)
    first_s = time.perf_counter() - t0
    out = first + proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {err.decode(errors='replace')[-400:]}")
    return first_s, out, usage.ru_maxrss * 1024  # Linux: ru_maxrss in KiB


def zinfer_run(model: str, threads: int, n_ctx: int) -> tuple[float, int]:
    """(seconds to the first answer byte, peak RSS bytes) of `zinfer run`."""
    argv = ["zinfer", "run", "--model", model, "--device", "cpu-fast", "--threads", str(threads),
            "--max-model-len", str(n_ctx), "--temperature", "0", "--max-tokens", "8", QUESTION]
    first_s, _, rss = run_child(argv)
    return first_s, rss


def llama_run(path: str, threads: int, n_ctx: int) -> tuple[float, float, int]:
    """(llama.cpp's load seconds, its load plus first token, peak RSS bytes)."""
    _, out, rss = run_child([sys.executable, "-c", LLAMA_CHILD, path, str(threads), str(n_ctx), QUESTION])
    figures = json.loads(out.decode().strip().splitlines()[-1])
    return figures["load_s"], figures["first_token_s"], rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096, help="context length of both (zinfer's --max-model-len)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from zinfer.models.loader import resolve

    path = str(resolve(args.model))
    zinfer_run(args.model, args.threads, args.n_ctx)  # warm: page cache, kernels, weights, tokenizer
    llama_run(path, args.threads, args.n_ctx)
    print("run | zinfer first token | llama.cpp load + first token (load) | ratio "
          "| zinfer peak RSS | llama.cpp peak RSS | ratio")
    for i in range(args.runs):
        z_s, z_rss = zinfer_run(args.model, args.threads, args.n_ctx)
        load_s, l_s, l_rss = llama_run(path, args.threads, args.n_ctx)
        print(f"{i + 1} | {z_s:.2f} s | {l_s:.2f} s ({load_s:.2f}) | {z_s / l_s:.2f}x | "
              f"{z_rss / 2**20:.0f} MiB | {l_rss / 2**20:.0f} MiB | {z_rss / l_rss:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
