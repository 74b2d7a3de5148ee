"""Regenerate the RoPE-scaling goldens (run by hand): llama.cpp on tiny models that scale RoPE.

    python3 tests/goldens/rope_goldens.py

Needs llama-cpp-python (the reference); tests/test_rope_scaling.py only reads the JSON
this writes. For each case in CASES it writes a tiny random f32 GGUF model
(tests/tiny.py write_tiny_gguf: the HF rope_scaling override is stored as llama.cpp's
converter stores it), runs a PROMPT_LEN-token prompt through llama.cpp (f32 KV cache,
flash attention off, one sequence, every position's logits) and keeps:

- top: at each of POSITIONS, llama.cpp's top-5 token ids and their logits;
- greedy_ids: N_GREEDY greedy tokens after the prompt (argmax after each step), and
  the smallest top-1/top-2 logit gap met on the way (a near-tie would make ids fragile).

The positions run well past each case's original context, where scaling matters.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: tiny.py

PROMPT_LEN = 200
POSITIONS = [15, 70, 140, 199]
N_GREEDY = 16
SETTINGS = dict(n_ctx=256, type_k=0, type_v=0, flash_attn=False, n_threads=2, seed=0, n_batch=256, logits_all=True)

# name -> (tiny arch, seed, config.json overrides). Each scaling on a different RoPE
# layout: llama's pair rotation, qwen2's halves, gemma3's scaled global layer. Heads of
# 64: cpu-llama's attention sums in llama.cpp's 64-wide steps.
SHAPE = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64)
CASES = {
    "llama3-freqs": ("llama", 11, {**SHAPE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                             "original_max_position_embeddings": 64}}),
    "yarn-qwen2": ("qwen2", 12, {**SHAPE, "rope_theta": 10000.0,
                                 "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 48}}),
    "yarn-llama": ("llama", 13, {**SHAPE, "rope_theta": 500.0,
                                 "rope_scaling": {"rope_type": "yarn", "factor": 3.0,
                                                  "original_max_position_embeddings": 40}}),
    "linear-gemma3": ("gemma3", 14, {**SHAPE, "query_pre_attn_scalar": 64,
                                     "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
}


def prompt_ids(vocab_size: int, seed: int) -> list[int]:
    """BOS then PROMPT_LEN - 1 random ordinary tokens."""
    rng = np.random.default_rng(seed)
    return [0] + [int(t) for t in rng.integers(2, vocab_size, PROMPT_LEN - 1)]


def run_case(path: Path, ids: list[int]) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), verbose=False, **SETTINGS)
    llm.eval(ids)
    scores = np.array(llm.scores[: len(ids)], np.float32)  # [PROMPT_LEN, vocab]
    top = []
    for p in POSITIONS:
        order = np.argsort(-scores[p], kind="stable")[:5]
        top.append({"position": p, "ids": [int(i) for i in order],
                    "logits": [round(float(scores[p, i]), 6) for i in order]})
    greedy, min_gap = [], float("inf")
    logits = scores[-1]
    for _ in range(N_GREEDY):
        a, b = np.sort(logits)[-2:]
        min_gap = min(min_gap, float(b - a))
        greedy.append(int(np.argmax(logits)))
        llm.eval([greedy[-1]])
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()  # [vocab]
    llm.close()
    return {"top": top, "greedy_ids": greedy, "min_greedy_gap": round(min_gap, 6)}


def main() -> int:
    import llama_cpp

    from tiny import tiny_config, write_tiny_gguf

    for name, (arch, seed, overrides) in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            path = write_tiny_gguf(Path(tmp) / f"{name}.gguf", arch, seed=seed, **overrides)
            ids = prompt_ids(tiny_config(arch, **overrides)["vocab_size"], seed)
            result = run_case(path, ids)
        golden = {
            "generator": "tests/goldens/rope_goldens.py",
            "llama_cpp_python": llama_cpp.__version__,
            "settings": {k: v for k, v in SETTINGS.items() if k != "seed"},
            "arch": arch,
            "seed": seed,
            "overrides": overrides,
            "prompt_ids": ids,
            **result,
        }
        out = HERE / f"rope_{name}.json"
        out.write_text(json.dumps(golden, indent=1) + "\n")
        print(f"{out.name}: greedy {result['greedy_ids']} (smallest gap {result['min_greedy_gap']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
