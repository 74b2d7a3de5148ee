"""llama.cpp's side of `zinfer bench --compare-llama-cpp` (needs llama-cpp-python).

The same model file, prompts, lengths and thread count, through llama.cpp's batch API
as llama-server drives it: the prompts of a group go in batches of up to 512 tokens
across sequences, then every sequence decodes one token per llama_decode. llama.cpp
keeps its defaults (weight repacking on, flash attention auto, f16 KV).

KV: by default each sequence gets its own KV stream (`kv_unified = False`), llama.cpp at
its best for unrelated prompts: llama.cpp gives each stream n_ctx / n_seq_max cells
(padded to 256), so n_ctx is n_seq_max times the longest sequence. The unified pool
(`kv_unified = True`, one pool of n_ctx cells) makes every token attend over every
sequence's cells; it is measured apart, at the largest stream count.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from zinfer.gateway.bench_figures import Stream, summarize
from zinfer.gateway.bench_plan import Plan, say, workload_prompts

N_BATCH = 512  # llama.cpp's default n_batch and n_ubatch


class LlamaModel:
    """A GGUF model loaded by llama.cpp with its default model params (repacking on)."""

    def __init__(self, path: str):
        try:
            import llama_cpp as L
        except ImportError:
            raise ValueError("--compare-llama-cpp needs llama-cpp-python: pip install 'zinfer[llama]'") from None
        self.L = L
        self._quiet = L.llama_log_callback(lambda level, text, data: None)  # keep a reference: C holds it
        L.llama_log_set(self._quiet, ctypes.c_void_p())
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            raise ValueError(f"llama.cpp could not load {path}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))

    def close(self) -> None:
        self.L.llama_model_free(self.model)


class LlamaContext:
    """One llama.cpp context: n_seq sequences of up to seq_len tokens each, in their own KV
    streams or (unified) one shared pool; `threads` for decode and batches alike."""

    def __init__(self, model: LlamaModel, n_seq: int, seq_len: int, threads: int, unified: bool):
        L = self.L = model.L
        self.n_vocab = model.n_vocab
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_seq * seq_len, N_BATCH, N_BATCH, n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        cp.kv_unified = unified
        self.ctx = L.llama_init_from_model(model.model, cp)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {n_seq} x {seq_len} tokens")
        self.batch = L.llama_batch_init(max(N_BATCH, n_seq), 0, 1)

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)

    def clear(self) -> None:
        """Forget every sequence's KV."""
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
        """The greedy token of the last decode's batch entry i."""
        ptr = ctypes.cast(self.L.llama_get_logits_ith(self.ctx, i), ctypes.POINTER(ctypes.c_float))
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())  # logits [n_vocab]

    def generate(self, prompts: list[list[int]], output_len: int) -> tuple[float, list[Stream]]:
        """Greedy decode of a group of prompts arriving together, from an empty KV:
        (arrival time, each sequence's token arrival times)."""
        self.clear()
        start = time.perf_counter()
        streams: list[Stream] = [[] for _ in prompts]
        last = [0] * len(prompts)
        entries = [(t, j, seq, j == len(ids) - 1) for seq, ids in enumerate(prompts) for j, t in enumerate(ids)]
        for s in range(0, len(entries), N_BATCH):
            chunk = entries[s : s + N_BATCH]
            self.decode(chunk)
            done = [(i, seq) for i, (_, _, seq, wants) in enumerate(chunk) if wants]
            for i, seq in done:
                last[seq] = self.argmax(i)
            now = time.perf_counter()
            for _, seq in done:
                streams[seq].append(now)
        for step in range(output_len - 1):
            self.decode([(last[s], len(prompts[s]) + step, s, True) for s in range(len(prompts))])
            last = [self.argmax(s) for s in range(len(prompts))]
            now = time.perf_counter()
            for stream in streams:
                stream.append(now)
        return start, streams


def bench_llama_cpp(
    path: str, plan: Plan, threads: int, unified_pool: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Every workload of the plan on llama.cpp, in separate KV streams: figures by workload
    key as bench_engine's; and (unified_pool) the largest stream count in one unified pool."""
    model = LlamaModel(path)
    try:
        prompts = workload_prompts(plan, model.n_vocab)
        seq_len = plan.prompt_len + plan.output_len

        def run(
            n_seq: int, length: int, unified: bool, groups: list[list[list[int]]], output_len: int
        ) -> list[tuple[float, list[Stream]]]:
            kv = ", unified KV" if unified else ""
            say(f"llama.cpp: {len(groups)} x {len(groups[0])} sequences of up to {length} tokens{kv}")
            ctx = LlamaContext(model, n_seq, length, threads, unified)
            try:
                ctx.generate(groups[0][:1], 2)  # warm-up: the first decode of a context sets its buffers up
                return [ctx.generate(g, output_len) for g in groups]
            finally:
                ctx.close()

        pre = run(1, plan.prefill_len + 1, False, [[p] for p in prompts["prefill"]], 1)
        prefill_s = sum(s[0][-1] - t for t, s in pre)
        ours: dict[str, Any] = {"prefill": {"prefill_tok_s": plan.prefill_requests * plan.prefill_len / prefill_s}}
        ours["decode_b1"] = summarize(run(1, seq_len, False, [[p] for p in prompts["decode_b1"]], plan.output_len))
        for n in plan.streams:
            ours[f"streams_{n}"] = summarize(run(n, seq_len, False, [prompts[f"streams_{n}"]], plan.output_len))
        unified = None
        if unified_pool and plan.streams:
            n = max(plan.streams)
            unified = {f"streams_{n}": summarize(run(n, seq_len, True, [prompts[f"streams_{n}"]], plan.output_len))}
        return ours, unified
    finally:
        model.close()
