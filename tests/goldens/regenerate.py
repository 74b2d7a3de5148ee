"""Regenerate the llama.cpp golden files for the real models (run by hand).

    python3 tests/goldens/regenerate.py [--models-dir DIR]

Needs llama-cpp-python (the reference); the project's tests only read the JSON this
writes. For each model it writes:

- tokens_<model>.json: llama.cpp's token ids for varied texts, tokenized with the
  model's own add-BOS flag and special tokens parsed (special=True).
- greedy_<model>.json: for raw-completion prompts, the prompt ids and llama.cpp's 32
  greedy token ids (argmax of the logits after each step, f32 KV cache, flash
  attention off, its default weight repacking), with the decoded text.
- greedy_<model>-norepack.json: the same with repacking off (use_extra_bufts=False),
  for models with weights llama.cpp repacks (SmolLM2's Q4_1 has none).
- greedy_<model>-f32.json: the same on an F32 copy of the model (f32_gguf.py), where
  llama.cpp does no int8 rounding of activations: a check of the forward pass itself
  (the two small models only).

    python3 tests/goldens/regenerate.py --models qwen2.5-coder-1.5b  # some models only
    python3 tests/goldens/regenerate.py --tiny  # only tiny_q4k.json (tiny_q4k.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q5_0.gguf",
    "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}
F32_COPIES = ("smollm2-135m", "gemma3-270m")  # an F32 copy of a 0.5B/1.5B model takes 2/6 GB

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "日本語のテキストと中文文本，还有한국어。",
    "Emoji: 😀👍🏽 🇫🇷 ❤️‍🔥",
    "    leading spaces and trailing   ",
    "tabs\tand\t\ttabs, runs     of      spaces",
    "line one\nline two\n\nline four\r\nwindows\n\n\n\nend",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<s>not a bos</s> <unk> <pad> <bos> <eos> <|endoftext|>",
    "Café, naïve, façade, Ångström, señor, Übermensch",
    "Numbers: 0 7 42 1234 3.14159 -2.5e10 1,000,000 2024-06-01",
    "It's they're we've I'm you'll he'd DON'T",
    "Mixed <b>HTML</b> and <table><tr><td>cells</td></tr></table>",
    "$x^2 + y^2 = z^2$ and ∑_{i=1}^n i = n(n+1)/2 → ∞",
    "",
    " ",
    "a\u00a0non-breaking\u2009thin space and zero\u200bwidth",
    "Ελληνικά, русский текст, العربية, עברית, हिन्दी",
]

PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):\n",
    "Here is a list of three fruits:\n1.",
    "Once upon a time, in a small village by the sea,",
    "Q: What is the boiling point of water in Celsius?\nA:",
    "The main differences between Python and C are",
    "import numpy as np\n\n# compute the mean of",
    "In 1969, the first humans landed on",
]

N_GREEDY = 32
SETTINGS = dict(n_ctx=512, type_k=0, type_v=0, flash_attn=False,
                n_threads=1,  # 1: the arithmetic is the same, and 2 threads spin at every barrier on a busy machine
                seed=0, n_batch=512, logits_all=False)
# Weight repacking (Q4_K, Q4_0, ... into interleaved rows, llama.cpp's default) changes
# its kernels and summation order. Llama() ignores use_extra_bufts=... (unknown keywords
# vanish into **kwargs), so model_params is patched instead.


@contextlib.contextmanager
def repacking(on: bool):
    """Make Llama() load models with use_extra_bufts = on."""
    import llama_cpp.llama_cpp as lib

    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = on
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default


def _add_bos(llm) -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))


def token_goldens(path: Path) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    add_bos = _add_bos(llm)
    cases = [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=add_bos, special=True)}
             for t in TEXTS]
    return {"add_bos": add_bos, "special": True, "cases": cases}


def has_repacked_weights(path: Path) -> bool:
    """Whether llama.cpp repacks any weight of this file (kernels/llama_cpp/llama_repack.py's rule)."""
    from zinfer.kernels.llama_cpp.llama_repack import repacks
    from zinfer.models.loader import open_model

    return any(repacks(t.qtype.name, t.shape) for name, t in open_model(path).tensors.items()
               if name != "token_embd.weight")


def greedy_goldens(path: Path, repack: bool = True) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    cases = []
    add_bos = None
    for prompt in PROMPTS:
        with repacking(repack):
            llm = Llama(model_path=str(path), verbose=False, **SETTINGS)  # fresh KV cache
        add_bos = _add_bos(llm)
        prompt_ids = llm.tokenize(prompt.encode(), add_bos=add_bos, special=True)
        out: list[int] = []
        step = prompt_ids
        for _ in range(N_GREEDY):
            llm.eval(step)
            ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))  # [n_vocab]
            step = [int(np.argmax(logits))]
            out.append(step[0])
        text = llm.detokenize(out).decode("utf-8", errors="replace")
        cases.append({"prompt": prompt, "prompt_ids": prompt_ids, "greedy_ids": out, "text": text})
        llm.close()
    return {"add_bos": add_bos, "n_greedy": N_GREEDY, "cases": cases}


def tiny_hidden(path: Path, repack: bool) -> list[list[float]]:
    """llama.cpp's final hidden states (after the output norm, pooling none) of every
    token of tiny_q4k.PROMPT, then of one decode step of NEXT: [7][256]."""
    import llama_cpp
    from llama_cpp import Llama
    from tiny_q4k import NEXT, PROMPT

    with repacking(repack):
        llm = Llama(model_path=str(path), verbose=False, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
                    **{**SETTINGS, "n_ctx": 64, "n_batch": 64, "logits_all": True})
    rows = []
    for step in (PROMPT, [NEXT]):
        llm.eval(step)
        for i in range(len(step)):
            ptr = llama_cpp.llama_get_embeddings_ith(llm.ctx, i)
            rows.append(np.ctypeslib.as_array(ptr, shape=(llm.n_embd(),)).astype(float).tolist())
    llm.close()
    return rows


def tiny_goldens(header: dict) -> None:
    from tiny_q4k import NEXT, PROMPT, write_tiny_q4k

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_q4k(Path(tmp) / "tiny_q4k.gguf")
        doc = {**greedy_header(header, True), "model": "tests/goldens/tiny_q4k.py",
               "prompt_ids": PROMPT, "next_id": NEXT,
               "hidden": "result_norm of each prompt token, then of the decode step: [7][256]",
               "repack": tiny_hidden(path, True), "norepack": tiny_hidden(path, False)}
    del doc["settings"]["use_extra_bufts"]
    (HERE / "tiny_q4k.json").write_text(json.dumps(doc) + "\n")
    print("wrote tiny_q4k.json")


def greedy_header(header: dict, repack: bool) -> dict:
    settings = {**SETTINGS, "use_extra_bufts": repack,
                "sampling": "argmax of last logits (temp 0), 32 steps, not stopped at end-of-generation",
                "prompt": "raw completion, BOS as model metadata says"}
    return {k: v for k, v in header.items() if k != "tokenize"} | {"settings": settings}


def main() -> int:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=None, help="default: zinfer's model cache")
    ap.add_argument("--skip-greedy", action="store_true")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--tiny", action="store_true", help="only tiny_q4k.json")
    args = ap.parse_args()
    header = {
        "generator": "tests/goldens/regenerate.py",
        "llama_cpp_python": llama_cpp.__version__,
        "tokenize": "Llama(vocab_only=True).tokenize(text.encode(), add_bos=<model flag>, special=True)",
    }
    sys.path.insert(0, str(HERE))
    from f32_gguf import write_f32_copy

    if args.tiny:
        tiny_goldens(header)
        return 0

    if args.models_dir is None:
        from zinfer.models.pull import cache_dir

        args.models_dir = str(cache_dir())
    for name in args.models:
        file = MODELS[name]
        path = Path(args.models_dir) / file
        if not path.exists():
            print(f"skip {name}: {path} not found", file=sys.stderr)
            continue
        doc = {**header, "model": name, "file": file, **token_goldens(path)}
        (HERE / f"tokens_{name}.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote tokens_{name}.json")
        if args.skip_greedy:
            continue
        for repack in (True, False):
            if not repack and not has_repacked_weights(path):
                continue
            doc = {**greedy_header(header, repack), "model": name, "file": file, **greedy_goldens(path, repack)}
            out = f"greedy_{name}{'' if repack else '-norepack'}.json"
            (HERE / out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
            print(f"wrote {out}")
        if name not in F32_COPIES:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            f32 = write_f32_copy(path, Path(tmp) / "f32.gguf")
            doc = {**greedy_header(header, True), "model": name, "file": f"{file} dequantized to F32",
                   **greedy_goldens(f32)}
        (HERE / f"greedy_{name}-f32.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote greedy_{name}-f32.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
