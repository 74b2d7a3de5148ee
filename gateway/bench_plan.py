"""The workloads of `zinfer bench`: its flags, the validated Plan they make, and the
synthetic prompts both engines (zinfer and llama.cpp) run."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np


def bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill-len", type=int, default=512, help="tokens per prompt of the prefill row")
    p.add_argument("--prefill-requests", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt of the decode and stream rows")
    p.add_argument("--output-len", type=int, default=32,
                   help="tokens generated per request of the decode and stream rows (at least 2)")
    p.add_argument("--decode-requests", type=int, default=4, help="requests of the batch-1 decode row, one at a time")
    p.add_argument("--streams", default="16,64",
                   help="comma-separated stream counts: N requests arriving together for each "
                        "(--max-running is raised to the largest)")
    p.add_argument("--bandwidth-mib", type=int, default=1024,
                   help="array read to measure this machine's bandwidth (0: skip)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every number")
    p.add_argument("--compare-llama-cpp", action="store_true",
                   help="run llama.cpp (llama-cpp-python) on the same model, prompts and threads")
    p.add_argument("--unified-pool", action=argparse.BooleanOptionalAction, default=True,
                   help="with --compare-llama-cpp: also run llama.cpp's largest stream count with one unified KV pool")
    # --threads (engine_args) sets llama.cpp's threads and cpu-fast's: one count for both


@dataclass(frozen=True)
class Plan:
    """The workloads of one bench run (validated sizes from the command line)."""

    prefill_len: int
    prefill_requests: int
    prompt_len: int
    output_len: int
    decode_requests: int
    streams: tuple[int, ...]

    @staticmethod
    def from_args(args: argparse.Namespace) -> "Plan":
        try:
            streams = tuple(int(s) for s in str(args.streams).split(",") if s.strip())
        except ValueError:
            raise ValueError(f"--streams takes comma-separated counts, got {args.streams!r}") from None
        plan = Plan(
            args.prefill_len, args.prefill_requests, args.prompt_len, args.output_len, args.decode_requests, streams)
        for name in ("prefill_len", "prefill_requests", "prompt_len", "decode_requests"):
            if getattr(plan, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if plan.output_len < 2:
            raise ValueError("--output-len must be at least 2 (decode is the tokens after the first)")
        if any(n < 1 or n > 256 for n in streams):
            raise ValueError("--streams counts must be between 1 and 256")
        return plan

    @property
    def max_len(self) -> int:
        """The longest sequence any workload builds."""
        return max(self.prefill_len + 1, self.prompt_len + self.output_len)


def say(text: str) -> None:
    """A progress line on stderr: on larger models a bench runs for minutes."""
    print(f"zinfer bench: {text}", file=sys.stderr, flush=True)


def synthetic_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n distinct prompts of `length` token ids (ordinary ids, away from the special ones)."""
    rng = np.random.default_rng(seed)
    lo, hi = min(1000, vocab // 4), min(vocab, 30000)
    return [rng.integers(lo, hi, size=length).tolist() for _ in range(n)]


def workload_prompts(plan: Plan, vocab: int) -> dict[str, list[list[int]]]:
    """Each workload's prompts, by its key (prefill, decode_b1, streams_N): distinct seeds,
    the same on both engines."""
    out = {"prefill": synthetic_prompts(plan.prefill_requests, plan.prefill_len, vocab, seed=1)}
    out["decode_b1"] = synthetic_prompts(plan.decode_requests, plan.prompt_len, vocab, seed=2)
    for i, n in enumerate(plan.streams):
        out[f"streams_{n}"] = synthetic_prompts(n, plan.prompt_len, vocab, seed=10 + i)
    return out
