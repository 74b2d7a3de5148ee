"""Fill-in-the-middle acceptance: ten code holes (tests/benchmarks/infill_holes.json, judged by
tests/infill_holes.py) through zinfer's llama-server `/infill`, and optionally the same holes
through llama.cpp (llama-cpp-python, same GGUF) for the side-by-side.

zinfer: `zinfer serve --device cpu-fast` (or --device) on the model, one greedy POST /infill per hole
(input_prefix, input_suffix, temperature 0, n_predict), at /infill's defaults otherwise
(the suffix-overlap stop on: gateway/PROTOCOL.md); `--body '{"stop_at_suffix": false}'`
adds fields to every request. llama.cpp: the plain FIM prompt (<|fim_prefix|> PREFIX
<|fim_suffix|> SUFFIX <|fim_middle|>, as zinfer's /infill lays it out without extra files),
greedy, ended by its end-of-generation tokens (which include the FIM pad and file separator)
or n_predict.

The middle goes into the hole; the file must compile and the hole's test pass (a fresh
Python, 10 s). Printed: each hole's pass or why not, the middle, tokens and why it stopped;
the score per engine, and llama.cpp's texts once more as zinfer's stop_at_suffix would have
cut them (the same model's middles under the same stop rule).

    python tests/benchmarks/bench_infill.py --model qwen2.5-coder-0.5b --llama-cpp
    python tests/benchmarks/bench_infill.py --check-answers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from http_server import running_server  # noqa: E402
from infill_holes import Hole, holes, judge  # noqa: E402

from zinfer.gateway.llama_server_stops import StreamCut, SuffixStop  # noqa: E402
from zinfer.models.pull import cached_path, pull  # noqa: E402

Fill = tuple[str, int, str]  # (middle, tokens generated, why it stopped)


def infill_body(hole: Hole, n_predict: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {"input_prefix": hole.prefix, "input_suffix": hole.suffix, "n_predict": n_predict, "temperature": 0,
            **extra}


def run_zinfer(model: Path, hs: list[Hole], n_predict: int, extra: dict[str, Any], device: str) -> list[Fill]:
    out = []
    with running_server(model, "--device", device, timeout=600) as server:
        for hole in hs:
            try:
                r = httpx.post(server.url + "/infill", json=infill_body(hole, n_predict, extra), timeout=600)
                r.raise_for_status()
            except httpx.HTTPError:
                print(server.log_tail(), file=sys.stderr)
                raise
            body = r.json()
            why = body["stop_type"] + (f" {body['stopping_word']!r}" if body.get("stopping_word") else "")
            out.append((body["content"], body["tokens_predicted"], why))
    return out


def run_llama_cpp(model: Path, hs: list[Hole], n_predict: int, threads: int) -> list[Fill]:
    """llama.cpp greedy on the plain FIM prompt, each hole from an empty KV cache."""
    from llama_cpp import Llama, llama_vocab_is_eog

    llm = Llama(str(model), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    vocab = llm._model.vocab

    def special(text: str) -> int:
        (tid,) = llm.tokenize(text.encode(), add_bos=False, special=True)
        return tid

    def ids(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=False, special=False) if text else []

    pre, suf, mid = special("<|fim_prefix|>"), special("<|fim_suffix|>"), special("<|fim_middle|>")
    out = []
    for hole in hs:
        prompt = [pre, *ids(hole.prefix), suf, *ids(hole.suffix), mid]
        llm.reset()
        tokens: list[int] = []
        why = "limit"
        for tok in llm.generate(prompt, temp=0.0, reset=True):
            if llama_vocab_is_eog(vocab, tok):
                why = f"eos {llm.detokenize([tok], special=True).decode(errors='replace')!r}"
                break
            tokens.append(tok)
            if len(tokens) >= n_predict:
                break
        out.append((llm.detokenize(tokens).decode("utf-8", errors="replace"), len(tokens), why))
    return out


def cut_at_suffix(hole: Hole, fill: Fill) -> Fill:
    """A text as zinfer's /infill stop_at_suffix would have ended it (the same rule, applied
    after the fact: the model's tokens up to the cut do not depend on the cut)."""
    cut = StreamCut(SuffixStop.around(hole.prefix, hole.suffix))
    middle = cut.feed(fill[0])
    middle += cut.end() if cut.reason is None else ""
    return middle, fill[1], fill[2] if cut.reason is None else f"cut ({cut.reason})"


def report(engine: str, hs: list[Hole], fills: list[Fill]) -> int:
    """Print each hole's verdict; the number that passed."""
    passed = 0
    print(f"\n== {engine}")
    for hole, (middle, n, why) in zip(hs, fills):
        verdict = judge(hole, middle)
        passed += verdict is None
        shown = middle if len(middle) <= 160 else middle[:160] + "..."
        print(f"{'PASS' if verdict is None else 'FAIL'}  {hole.name:<24} {hole.kind:<14} {n:>3} tokens, {why}")
        if verdict is not None:
            print(f"      {verdict}")
        print(f"      middle: {shown!r}")
    print(f"{engine}: {passed}/{len(hs)} holes filled so that the file compiles and its test passes")
    return passed


def model_path(name: str) -> Path:
    if Path(name).exists():
        return Path(name)
    return cached_path(name) or pull(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="a `zinfer pull` name or a GGUF path")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--body", default="{}", help="JSON fields added to every /infill request")
    ap.add_argument("--device", default="cpu-fast", help="zinfer serve's device (cpu: the float32 oracle)")
    ap.add_argument("--llama-cpp", action="store_true", help="also run the holes through llama-cpp-python")
    ap.add_argument("--no-zinfer", action="store_true", help="skip zinfer (with --llama-cpp)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's (zinfer uses every core)")
    ap.add_argument("--check-answers", action="store_true", help="judge the reference answers only")
    args = ap.parse_args()
    hs = holes()
    if args.check_answers:
        report("reference answers", hs, [(h.answer, 0, "-") for h in hs])
        return
    model = model_path(args.model)
    print(f"{model.name}: {len(hs)} holes, greedy, n_predict {args.n_predict}")
    scores = {}
    if not args.no_zinfer:
        extra = json.loads(args.body)
        scores["zinfer"] = report(f"zinfer /infill {json.dumps(extra)} on {args.device}", hs,
                                  run_zinfer(model, hs, args.n_predict, extra, args.device))
    if args.llama_cpp:
        fills = run_llama_cpp(model, hs, args.n_predict, args.threads)
        scores["llama.cpp"] = report(f"llama.cpp plain FIM, {args.threads} threads", hs, fills)
        scores["llama.cpp + zinfer's stop_at_suffix"] = report(
            "llama.cpp's texts, cut where zinfer's stop_at_suffix would cut them", hs,
            [cut_at_suffix(h, f) for h, f in zip(hs, fills)])
    print("\n" + ", ".join(f"{k} {v}/{len(hs)}" for k, v in scores.items()))


if __name__ == "__main__":
    main()
