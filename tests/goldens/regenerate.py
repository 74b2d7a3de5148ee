"""Regenerate the llama.cpp golden files for the real models (run by hand).

    python3 tests/goldens/regenerate.py [--models-dir DIR]

Needs llama-cpp-python (the reference); the project's tests only read the JSON this
writes. For each model it writes:

- tokens_<model>.json: llama.cpp's token ids for varied texts, tokenized with the
  model's own add-BOS flag and special tokens parsed (special=True).
- greedy_<model>.json: for raw-completion prompts, the prompt ids and llama.cpp's 32
  greedy token ids (argmax of the logits after each step, f32 KV cache, flash
  attention off), with the decoded text.
- greedy_<model>-f32.json: the same on an F32 copy of the model (f32_gguf.py), where
  llama.cpp does no int8 rounding of activations: a check of the forward pass itself.
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
}

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
                n_threads=2, seed=0, n_batch=512, logits_all=False)
# Weight repacking (Q4_K, Q6_K, ... into interleaved rows) changes llama.cpp's summation
# order; the goldens use its plain per-row kernels. Llama() ignores use_extra_bufts=...
# (unknown keywords vanish into **kwargs), so model_params is patched instead.
REPACK = False


@contextlib.contextmanager
def plain_kernels():
    """Make Llama() load models with use_extra_bufts = REPACK."""
    import llama_cpp.llama_cpp as lib

    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = REPACK
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


def greedy_goldens(path: Path) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    cases = []
    add_bos = None
    for prompt in PROMPTS:
        with plain_kernels():
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


def main() -> int:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=None, help="default: zinfer's model cache")
    ap.add_argument("--skip-greedy", action="store_true")
    args = ap.parse_args()
    header = {
        "generator": "tests/goldens/regenerate.py",
        "llama_cpp_python": llama_cpp.__version__,
        "tokenize": "Llama(vocab_only=True).tokenize(text.encode(), add_bos=<model flag>, special=True)",
    }
    sys.path.insert(0, str(HERE))
    from f32_gguf import write_f32_copy

    if args.models_dir is None:
        from zinfer.models.pull import cache_dir

        args.models_dir = str(cache_dir())
    for name, file in MODELS.items():
        path = Path(args.models_dir) / file
        if not path.exists():
            print(f"skip {name}: {path} not found", file=sys.stderr)
            continue
        doc = {**header, "model": name, "file": file, **token_goldens(path)}
        (HERE / f"tokens_{name}.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote tokens_{name}.json")
        if args.skip_greedy:
            continue
        g_header = {**header, "settings": {**SETTINGS, "use_extra_bufts": REPACK, "sampling": "argmax of last logits (temp 0), 32 steps, not stopped at end-of-generation",
                                           "prompt": "raw completion, BOS as model metadata says"}}
        del g_header["tokenize"]
        doc = {**g_header, "model": name, "file": file, **greedy_goldens(path)}
        (HERE / f"greedy_{name}.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote greedy_{name}.json")
        with tempfile.TemporaryDirectory() as tmp:
            f32 = write_f32_copy(path, Path(tmp) / "f32.gguf")
            doc = {**g_header, "model": name, "file": f"{file} dequantized to F32", **greedy_goldens(f32)}
        (HERE / f"greedy_{name}-f32.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote greedy_{name}-f32.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
