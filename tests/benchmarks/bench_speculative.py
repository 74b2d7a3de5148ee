"""Speculative decoding, batch 1, greedy: zinfer with drafts vs zinfer plain vs llama.cpp plain
(and, on code edits, llama.cpp's own prompt lookup, LlamaPromptLookupDecoding).

Two workloads:
- code (the default): tests/benchmarks/speculative_prompts.json, 20 chat prompts that each ask for
  a function or file back with a small change, so the answer mostly repeats the prompt; zinfer
  drafts by prompt lookup (ngram);
- chat (--workload chat): tests/benchmarks/chat_prompts.json, 20 free-form chat prompts; zinfer
  drafts with a draft model (--draft-model, by default Qwen2.5-Coder-0.5B for the 1.5B).
Every prompt is tokenized once by zinfer's chat template and the same ids go to llama.cpp.
llama.cpp runs through llama-cpp-python at its defaults (Llama(...) with only n_ctx and the thread
count set; LlamaPromptLookupDecoding() at its defaults), on the same thread count as zinfer.

Printed per configuration: decode tok/s (tokens after the first over the time from the first
token to the last, summed over the prompts: prefill is the same work with or without drafts),
end-to-end tok/s, and the ratios to llama.cpp plain; and whether the outputs are identical
(zinfer speculative vs zinfer plain, llama.cpp lookup vs llama.cpp plain, zinfer vs llama.cpp).

    python tests/benchmarks/bench_speculative.py --prompts 5 --max-tokens 256
    python tests/benchmarks/bench_speculative.py --workload chat --prompts 5
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
import trio

from zinfer.actors.speculation import SpeculationConfig
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import SamplingParams

PROMPTS = {"code": Path(__file__).with_name("speculative_prompts.json"),
           "chat": Path(__file__).with_name("chat_prompts.json")}
MODEL = Path.home() / ".cache/zinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT_MODEL = Path.home() / ".cache/zinfer/models/qwen2.5-coder-0.5b-instruct-q5_0.gguf"

Run = tuple[list[int], float, float, float]  # (token ids, start, first token, last token) in perf_counter s


def zinfer_runs(model: str, chats: list[list[dict[str, str]]], max_tokens: int, device: str, mode: str = "ngram",
                speculation: SpeculationConfig | None = None,
                ) -> tuple[list[list[int]], dict[str, list[Run]], dict[str, int]]:
    """(prompt ids, runs by mode "off" / mode ("ngram" or "draft"), drafted and accepted counts) on
    one engine, batch 1, drafting as speculation says (its mode is the request's)."""
    config = EngineConfig(model=model, device=device, max_running=1, prefix_caching=False,
                          speculation=speculation or SpeculationConfig())
    prompt_ids: list[list[int]] = []
    runs: dict[str, list[Run]] = {"off": [], mode: []}
    counts = {"drafted": 0, "accepted": 0}

    async def one(client: AsyncClient, chat: list[dict[str, str]], mode: str) -> tuple[Run, list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, speculative=mode)
        ids: list[int] = []
        start = time.perf_counter()
        first = last = start
        prompt: list[int] = []
        async for ev in client.generate(messages=chat, params=params):
            if isinstance(ev, Delta) and ev.token_ids:
                last = time.perf_counter()
                first = first if ids else last
                ids += ev.token_ids
            elif isinstance(ev, Finished):
                prompt = list(ev.prompt_ids or [])
        return (ids, start, first, last), prompt

    async def main(engine: EngineThread) -> None:
        async with AsyncClient(engine.ctx, engine.address) as client:
            await one(client, chats[0], mode)  # warm-up: kernels compiled, drafted rounds seen once
            await one(client, chats[0], "off")
            before = await client.stats()
            for chat in chats:
                for m in ("off", mode):
                    run, prompt = await one(client, chat, m)
                    runs[m].append(run)
                prompt_ids.append(prompt)
            after = await client.stats()
            for key in counts:
                counts[key] = getattr(after, f"{key}_tokens", 0) - getattr(before, f"{key}_tokens", 0)

    with EngineThread(config) as engine:
        trio.run(main, engine)
    return prompt_ids, runs, counts


def llama_runs(model: str, prompt_ids: list[list[int]], max_tokens: int, threads: int, lookup: bool) -> list[Run]:
    """llama.cpp through llama-cpp-python at its defaults, greedy, each prompt from an empty KV."""
    from llama_cpp import Llama, llama_vocab_is_eog
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding() if lookup else None
    llm = Llama(model, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False, draft_model=draft)
    vocab = llm._model.vocab
    out = []
    for ids in [prompt_ids[0]] + prompt_ids:  # the first once more, as a warm-up
        llm.reset()
        tokens: list[int] = []
        start = time.perf_counter()
        first = last = start
        for tok in llm.generate(ids, temp=0.0, reset=True):
            last = time.perf_counter()
            first = first if tokens else last
            tokens.append(tok)
            if llama_vocab_is_eog(vocab, tok) or len(tokens) >= max_tokens:
                break
        out.append((tokens, start, first, last))
    return out[1:]


def figures(runs: list[Run]) -> dict[str, float]:
    tokens = sum(len(r[0]) for r in runs)
    decode_s = sum(r[3] - r[2] for r in runs)
    total_s = sum(r[3] - r[1] for r in runs)
    decode = sum(len(r[0]) - 1 for r in runs) / decode_s
    return {"tokens": tokens, "decode_tok_s": decode, "e2e_tok_s": tokens / total_s}


def same(a: list[Run], b: list[Run], eos: set[int]) -> str:
    """How many prompts give the same tokens (a trailing end-of-generation token ignored)."""
    def strip(ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] in eos else ids
    n = sum(strip(x[0]) == strip(y[0]) for x, y in zip(a, b))
    return f"{n}/{len(a)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--workload", default="code", choices=("code", "chat"),
                    help="code: code edits, prompt-lookup drafts; chat: free-form chat, a draft model's drafts")
    ap.add_argument("--draft-model", default=str(DRAFT_MODEL), help="the chat workload's draft model")
    ap.add_argument("--prompts", type=int, default=20, help="the first N prompts of the workload")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's (zinfer uses every core)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--skip-llama", action="store_true")
    defaults = SpeculationConfig()
    ap.add_argument("--max-draft", type=int, default=defaults.max_draft, help="prompt lookup's drafts a round")
    ap.add_argument("--draft-max", type=int, default=defaults.draft_max, help="a draft model's drafts a round")
    ap.add_argument("--draft-p-min", type=float, default=defaults.draft_p_min)
    ap.add_argument("--draft-head", type=int, default=defaults.draft_head, help="the draft's LM head ids")
    args = ap.parse_args()
    chats = [p["messages"] for p in json.loads(PROMPTS[args.workload].read_text())][: args.prompts]
    mode = "ngram" if args.workload == "code" else "draft"
    print(f"load: {open('/proc/loadavg').read().strip()}")
    draft = args.draft_model if mode == "draft" else ""
    speculation = SpeculationConfig(draft_model=draft, max_draft=args.max_draft, draft_max=args.draft_max,
                                    draft_p_min=args.draft_p_min,
                                    draft_head=args.draft_head)
    prompt_ids, ours, counts = zinfer_runs(args.model, chats, args.max_tokens, args.device, mode, speculation)
    spec_name = "zinfer speculative" if mode == "ngram" else "zinfer draft model"
    rows = {"zinfer plain": figures(ours["off"]), spec_name: figures(ours[mode])}
    eos = {151643, 151645}  # Qwen2.5's <|endoftext|>, <|im_end|>
    checks = {f"{spec_name} == zinfer plain": same(ours[mode], ours["off"], eos)}
    if not args.skip_llama:
        plain = llama_runs(args.model, prompt_ids, args.max_tokens, args.threads, lookup=False)
        rows["llama.cpp plain"] = figures(plain)
        if mode == "ngram":
            lookup = llama_runs(args.model, prompt_ids, args.max_tokens, args.threads, lookup=True)
            rows["llama.cpp prompt lookup"] = figures(lookup)
            checks["llama.cpp lookup == llama.cpp plain"] = same(lookup, plain, eos)
        checks["zinfer plain == llama.cpp plain"] = same(ours["off"], plain, eos)
    base = rows.get("llama.cpp plain")
    what = "code-edit" if mode == "ngram" else f"chat ({Path(draft).name} drafting)"
    print(f"{len(chats)} {what} prompts, batch 1, greedy, max_tokens {args.max_tokens}, threads {args.threads}, "
          + (f"draft max {args.draft_max}, p_min {args.draft_p_min}, head {args.draft_head}" if draft
             else f"max draft {args.max_draft}"))
    for name, f in rows.items():
        ratio = f" ({f['decode_tok_s'] / base['decode_tok_s']:.2f}x llama.cpp plain)" if base else ""
        print(f"{name:26s} {f['tokens']:6.0f} tokens  decode {f['decode_tok_s']:7.2f} tok/s{ratio}"
              f"  end-to-end {f['e2e_tok_s']:7.2f} tok/s")
    rate = counts["accepted"] / counts["drafted"] if counts["drafted"] else 0.0
    print(f"zinfer drafts: {counts['drafted']} drafted, {counts['accepted']} accepted ({rate:.0%})")
    for what, n in checks.items():
        print(f"identical outputs, {what}: {n}")
    print(f"load: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
