"""The draft model's LM head cut to the token ids worth proposing (SpeculationConfig.draft_head).

A draft step reads every weight of the draft model once, and a small model's LM head is a large
share of them: Qwen2.5-Coder-0.5B's is 145 MB of the 392 MB a step reads (151,936 rows). A
draft only has to be right often, not always (verification keeps the target's output exact), so
the drafter computes logits for the first `keep` ids only, plus the end-of-generation ids. BPE
vocabularies number their merges in the order they were learned, most frequent first, so the
first ids carry most text: Qwen2.5's first 32,768 ids are 93% of the tokens of this repository's
English docs, Python and chat prompts (checked with its tokenizer), and cutting the head there
makes a 0.5B draft step 30% cheaper (16.2 -> 11.5 ms, BENCHMARKS.md). A token past the cut is
never proposed; where the target wants one, that round's draft is rejected at it, as any wrong
draft is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from zinfer.kernels.tensor import TensorData


def head_ids(vocab: int, keep: int, always: Iterable[int]) -> np.ndarray | None:
    """The token ids the cut head computes, ascending: ids below keep and the `always` ids
    below vocab ([H] int64); None when that is every id below vocab (no cut: keep 0 or
    keep >= vocab)."""
    if keep <= 0 or keep >= vocab:
        return None
    extra = [i for i in always if keep <= i < vocab]
    return np.unique(np.concatenate([np.arange(keep, dtype=np.int64), np.asarray(extra, dtype=np.int64)]))


def cut_head(tensors: Any, upload: Any, ids: np.ndarray) -> Any:
    """The LM head's rows `ids` ([H]) as a device weight [H, d]: the output matrix's rows (the
    embedding's when tied), uploaded through upload(name, TensorData). A quantized tensor's rows
    are whole blocks, so taking rows keeps the file's bytes and type."""
    name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    t: TensorData = tensors[name]
    rows = np.ascontiguousarray(np.asarray(t.data)[ids])  # [H, row bytes] (quantized) or [H, d]
    return upload(name, TensorData(t.qtype, (int(ids.size), int(t.shape[1])), rows))
