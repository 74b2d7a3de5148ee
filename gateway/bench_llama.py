"""llama.cpp's side of `zinfer bench --compare-llama-cpp` (needs llama-cpp-python).

The same model file, prompts, lengths, concurrency and thread count, run through
llama.cpp's batch API: several sequences decode together in one llama_decode, as
llama-server does. llama.cpp keeps its defaults (f16 KV cache, flash attention auto).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time

import numpy as np

from zinfer.gateway.bench import synthetic_prompts


class LlamaCpp:
    def __init__(self, path: str, threads: int, n_seq: int, n_ctx: int):
        try:
            import llama_cpp as L
        except ImportError:
            raise ValueError("--compare-llama-cpp needs llama-cpp-python: pip install 'zinfer[llama]'") from None
        self.L = L
        self._quiet = L.llama_log_callback(lambda level, text, data: None)  # keep a reference: C holds it
        L.llama_log_set(self._quiet, ctypes.c_void_p())
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 512, 512, n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        cp.kv_unified = True  # one KV pool shared by all sequences, as llama-server runs
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(max(512, n_seq), 0, n_seq)

    def clear(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants_logits) entries."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        if self.L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(self, i: int) -> int:
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,)).argmax())

    def prefill(self, prompts: list[list[int]]) -> float:
        """Seconds to prefill each prompt (one sequence at a time, 512-token batches)."""
        t0 = time.perf_counter()
        for ids in prompts:
            self.clear()
            for s in range(0, len(ids), 512):
                chunk = ids[s : s + 512]
                self.decode([(t, s + j, 0, s + j == len(ids) - 1) for j, t in enumerate(chunk)])
        return time.perf_counter() - t0

    def generate(self, prompts: list[list[int]], output_len: int) -> tuple[int, float]:
        """Greedy decode of a group of prompts together; (tokens after the first, seconds)."""
        self.clear()
        last = []
        for seq, ids in enumerate(prompts):
            self.decode([(t, j, seq, j == len(ids) - 1) for j, t in enumerate(ids)])
            last.append(self.argmax(len(ids) - 1))
        t0 = time.perf_counter()
        for step in range(output_len - 1):
            self.decode([(last[s], len(prompts[s]) + step, s, True) for s in range(len(prompts))])
            last = [self.argmax(s) for s in range(len(prompts))]
        return len(prompts) * (output_len - 1), time.perf_counter() - t0

    def close(self) -> None:
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def bench_llama_cpp(path: str, args: argparse.Namespace, ours: dict) -> dict:
    c = args.concurrency
    llm = LlamaCpp(path, args.threads or os.cpu_count() or 1, c, n_ctx=c * (args.prompt_len + args.output_len) + 64)
    try:
        vocab = llm.n_vocab
        prompts = synthetic_prompts(args.requests, args.prompt_len, vocab)
        llm.prefill(prompts[:1])  # warm-up
        pre = llm.prefill(synthetic_prompts(args.requests, args.prompt_len, vocab, seed=1))
        tokens, seconds = 0, 0.0
        for g in range(0, len(prompts), c):
            n, s = llm.generate(prompts[g : g + c], args.output_len)
            tokens, seconds = tokens + n, seconds + s
        return {"prefill_tok_s": args.requests * args.prompt_len / pre, "decode_tok_s": tokens / seconds if seconds else 0.0}
    finally:
        llm.close()
