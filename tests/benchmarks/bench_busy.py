"""cpu-fast and llama.cpp decode speed on an idle machine and with one core kept busy (not a test).

    python tests/benchmarks/bench_busy.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--repeat 3]

For each model and engine, one worker process (so llama.cpp's OpenMP and numba's never
share a process, and each starts fresh) loads the model, warms up, then measures greedy
decode tok/s at batch 1 and of 16 streams: first with the machine as it is ("idle"),
then while a busy process (`while True: pass`, pinned nowhere, started by the worker and
ended by it, and in any case after --busy-limit seconds) keeps one core's worth of CPU
taken; each busy row is measured after --settle seconds under that load, as a server that
was already running would meet it. Both engines at their defaults and the same thread
count (every core): zinfer through FastCpuDevice with the engine's defaults (int8
kernels, f16 KV, decode graphs, adaptive threads) driven by round_logits as the executor
runs rounds (no engine bus); llama.cpp through the batch API wrapper of `zinfer bench`
(gateway/bench_llama.py), each sequence in its own KV stream.

Prints the CPU, the load average around each measurement (other work on the machine
shows there: compare rows taken at the same load only), a table of tok/s with the
ratios busy/idle and zinfer/llama.cpp. Decode rate: tokens after each sequence's first,
over the time from the first decode round's start to the last token (median of
--repeat runs, fewer where a row's runs passed ROW_BUDGET_S).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

BLOCK = 16
PROMPT_LEN = 128
CASES = ((1, 64), (16, 32))  # (streams, tokens generated per stream)
ROW_BUDGET_S = 30.0  # a row stops repeating once its runs took this long
HOG = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end: pass"


def cpu_name() -> str:
    """The CPU's model name and its int8 features, from /proc/cpuinfo."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    feats = [f for f in ("avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{name}, {os.cpu_count()} logical CPUs" + (f" ({', '.join(feats)})" if feats else "")


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """n distinct prompts of PROMPT_LEN ordinary token ids."""
    rng = np.random.default_rng(seed)
    return [rng.integers(min(1000, vocab // 4), min(vocab, 30000), PROMPT_LEN).tolist() for _ in range(n)]


class Zinfer:
    """cpu-fast as the engine builds it by default, rounds driven as the executor drives them."""

    def __init__(self, path: str):
        from zinfer.devices.config import CpuFastConfig
        from zinfer.devices.cpu_fast import FastCpuDevice
        from zinfer.models.loader import open_model
        from zinfer.models.weights import build_weights

        c = CpuFastConfig()
        src = open_model(path)
        self.spec = src.spec
        self.vocab = src.spec.vocab_size
        self.dev = FastCpuDevice(threads=c.threads or None, int8=c.int8, kv_f16=c.kv_f16, decode_graphs=c.decode_graphs)
        self.w = build_weights(self.spec, src.tensors, self.dev.upload)
        self.per_seq = -(-(PROMPT_LEN + max(n for _, n in CASES) + 1) // BLOCK)
        self.kv = self.dev.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim,
                                    self.per_seq * max(s for s, _ in CASES), BLOCK)

    def decode(self, seqs: list[list[int]], steps: int) -> float:
        """Prefill seqs in one round, then `steps` - 1 greedy decode rounds: decode tok/s."""
        from zinfer.devices.batch import ForwardBatch
        from zinfer.models.forward import round_logits

        tables = [list(range(i * self.per_seq, (i + 1) * self.per_seq)) for i in range(len(seqs))]
        logits = round_logits(self.spec, self.w, self.dev, self.kv,
                              ForwardBatch.build([(s, 0, t, True) for s, t in zip(seqs, tables)], BLOCK))
        pos = [len(s) for s in seqs]
        t0 = time.perf_counter()
        for _ in range(steps - 1):
            nxt = logits.argmax(axis=1)
            b = ForwardBatch.build([([int(n)], p, t, True) for n, p, t in zip(nxt, pos, tables)], BLOCK)
            logits = round_logits(self.spec, self.w, self.dev, self.kv, b)
            pos = [p + 1 for p in pos]
        return len(seqs) * (steps - 1) / (time.perf_counter() - t0)

    def warm(self) -> None:
        """Compile (or load) the kernels, record the decode graphs of the measured shapes."""
        for n, _ in CASES:
            self.decode(prompts(n, self.vocab, 0), 3)
        self.dev.settle(300.0)
        for n, _ in CASES:
            self.decode(prompts(n, self.vocab, 0), 3)


class Llama:
    """llama.cpp at its defaults (gateway/bench_llama.py), every core, one KV stream per sequence."""

    def __init__(self, path: str):
        from zinfer.gateway.bench_llama import LlamaContext, LlamaModel

        self.model = LlamaModel(path)
        self.vocab = self.model.n_vocab
        threads = os.cpu_count() or 1
        self.contexts = {n: LlamaContext(self.model, n, PROMPT_LEN + steps + 1, threads, unified=False)
                         for n, steps in CASES}

    def decode(self, seqs: list[list[int]], steps: int) -> float:
        _, streams = self.contexts[len(seqs)].generate(seqs, steps)
        first = max(s[0] for s in streams)  # the last prompt's first token: decode rounds start here
        return len(seqs) * (steps - 1) / (streams[0][-1] - first)

    def warm(self) -> None:
        for n, _ in CASES:
            self.decode(prompts(n, self.vocab, 0), 3)


def worker(engine: str, path: str, repeat: int, settle: float, busy_limit: float) -> dict:
    """This process's figures: {"idle"|"busy": {streams: tok/s}, "load": {...: (before, after)}}."""
    side = Zinfer(path) if engine == "zinfer" else Llama(path)
    side.warm()
    out: dict = {}

    def measure(state: str) -> None:
        out[state], loads = {}, {}
        for i, (n, steps) in enumerate(CASES):
            before, start = os.getloadavg()[0], time.monotonic()
            runs = []
            for r in range(repeat):
                runs.append(side.decode(prompts(n, side.vocab, 1 + i * 100 + r), steps))
                # a crawling row: fewer runs, so the busy process outlives them
                if time.monotonic() - start > ROW_BUDGET_S:
                    break
            out[state][n] = float(np.median(runs))
            loads[n] = (before, os.getloadavg()[0])
        out[f"load_{state}"] = loads

    measure("idle")
    hog = subprocess.Popen([sys.executable, "-c", HOG.format(limit=busy_limit)])
    try:
        end = time.monotonic() + settle
        while time.monotonic() < end:  # the load met by a running server: rounds of each shape under it before timing
            for n, _ in CASES:
                side.decode(prompts(n, side.vocab, 0), 8)
        measure("busy")
        out["busy_ended_early"] = hog.poll() is not None  # then some busy rows ran on an idle machine
    finally:
        hog.kill()
        hog.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b",
                    help="known model names or .gguf paths, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row (the median is shown)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of decoding under the busy load before its rows are timed")
    ap.add_argument("--busy-limit", type=float, default=300.0,
                    help="the busy process ends itself after this many seconds")
    ap.add_argument("--engines", default="zinfer,llama.cpp")
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.repeat, args.settle, args.busy_limit)))
        return

    from zinfer.models.loader import resolve

    print(f"CPU: {cpu_name()}; load average at start {os.getloadavg()[0]:.2f} (1 min)")
    engines = args.engines.split(",")
    results: dict = {}
    for model in args.models.split(","):
        path = str(resolve(model))
        for engine in engines:
            print(f"... {model} on {engine}", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, __file__, "--worker", engine, path,
                                   "--repeat", str(args.repeat), "--settle", str(args.settle),
                                   "--busy-limit", str(args.busy_limit)], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{engine} on {model} failed:\n{proc.stderr[-4000:]}")
            results[(model, engine)] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\ndecode tok/s, {PROMPT_LEN}-token prompts; 'busy': one `while True: pass` process beside; "
          "load = 1-min load average before/after each row")
    print(f"{'model':20s} {'case':10s} {'engine':10s} {'idle':>7s} {'busy':>7s} {'busy/idle':>9s}  "
          f"{'load idle':>10s} {'load busy':>10s}")
    for model in args.models.split(","):
        for n, steps in CASES:
            case = f"b1 x{steps}" if n == 1 else f"{n} streams"
            for engine in engines:
                r = results[(model, engine)]
                idle, busy = r["idle"][str(n)], r["busy"][str(n)]
                li, lb = r["load_idle"][str(n)], r["load_busy"][str(n)]
                early = ("  (the busy process ended before these rows did: raise --busy-limit)"
                         if r.get("busy_ended_early") else "")
                print(f"{model:20s} {case:10s} {engine:10s} {idle:7.1f} {busy:7.1f} {busy / idle:9.2f}  "
                      f"{li[0]:4.1f}/{li[1]:<4.1f}  {lb[0]:4.1f}/{lb[1]:<4.1f}{early}")
            if len(engines) == 2:
                a, b = (results[(model, e)] for e in engines)
                print(f"{'':20s} {'':10s} {engines[0] + '/' + engines[1]:21s} "
                      f"{a['idle'][str(n)] / b['idle'][str(n)]:7.2f} {a['busy'][str(n)] / b['busy'][str(n)]:7.2f}")


if __name__ == "__main__":
    main()
