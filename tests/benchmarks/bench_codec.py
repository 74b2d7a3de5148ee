"""Codec speed on real bus messages: µs per encode and decode of a decode round's
`Round` (32 sequences) and of a `RoundLogits` carrying a 4 MiB logits array (a frame,
not copied). Prints numbers; asserts nothing.

    python tests/benchmarks/bench_codec.py [--n 20000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

from zinfer.messages.codec import Codec
from zinfer.messages.engine import ExecutorInbox, Round, RoundLogits, RoundSeq, SamplerInbox


def us_per_call(fn: Callable[[], Any], n: int) -> float:
    """Mean µs of one fn() over n calls, after one warm-up call."""
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000,
                    help="calls per small-message measurement (a tenth for the big one)")
    args = ap.parse_args()
    rounds, logits = Codec(ExecutorInbox), Codec(SamplerInbox)
    decode_round = Round(7, [RoundSeq(i, [1000 + i], 300 + i, 19, [], True) for i in range(32)])
    big = RoundLogits(7, list(range(21)), np.zeros((21, 49152), np.float32))  # 21 x 49152 x 4 B ~ 4 MiB
    round_frames, big_frames = rounds.encode(decode_round), logits.encode(big)
    print(f"Round of 32 decodes: encode {us_per_call(lambda: rounds.encode(decode_round), args.n):.2f} µs, "
          f"decode {us_per_call(lambda: rounds.decode(round_frames), args.n):.2f} µs")
    print(f"RoundLogits 4 MiB:   encode {us_per_call(lambda: logits.encode(big), args.n // 10):.2f} µs, "
          f"decode {us_per_call(lambda: logits.decode(big_frames), args.n // 10):.2f} µs")


if __name__ == "__main__":
    main()
