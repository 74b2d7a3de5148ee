"""The issue's replica runs, on a local Ray cluster (ray.cluster_utils.Cluster) on this machine:

  chaos: N streamed greedy chat completions at concurrency C across R replicas while a replica
         process is killed K times (the issue: 1,000 requests, 32, 2 replicas, 10 kills);
         every request must complete with the fault-free text, and /metrics must show nothing
         in flight and no KV block in use afterwards.
  chat:  32 conversations x 4 turns sharing a system prompt, on one replica, then on R
         replicas routed by prefix affinity and by round-robin: the prefix-cache hit rate
         (cached / prompt tokens) and time to first token p50 / p99 of each.

    python tests/benchmarks/bench_replicas.py chaos [--requests 1000 --kills 10]
    python tests/benchmarks/bench_replicas.py chat
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replica_chaos import chaos, ray_cluster, replicated_server  # noqa: E402

SYSTEM = ("You are the support assistant of a small bicycle shop. You answer in one or two short sentences, "
          "you never invent prices, and you suggest visiting the shop when a repair needs hands-on work. ") * 2
QUESTIONS = ["My chain keeps slipping, what should I check?", "And if that does not help?",
             "How long would a repair take?", "Thanks, anything else I should know?"]


async def conversation(client: httpx.AsyncClient, url: str, i: int, max_tokens: int,
                       out: list[tuple[float, int, int]]) -> None:
    """Four turns of one conversation; out gets (ttft_s, prompt_tokens, cached_tokens) per turn."""
    messages = [{"role": "system", "content": SYSTEM}]
    for q in QUESTIONS:
        messages.append({"role": "user", "content": f"(customer {i}) {q}"})
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        t0, ttft, text, usage = time.perf_counter(), 0.0, [], {}
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as resp:
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for c in chunk.get("choices", []):
                    piece = c.get("delta", {}).get("content") or ""
                    if piece and not ttft:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
        messages.append({"role": "assistant", "content": "".join(text)})
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        out.append((ttft, usage.get("prompt_tokens", 0), cached))


async def chat_load(url: str, conversations: int, max_tokens: int) -> dict[str, float]:
    out: list[tuple[float, int, int]] = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=conversations + 4)) as client:
        async with trio.open_nursery() as nursery:
            for i in range(conversations):
                nursery.start_soon(conversation, client, url, i, max_tokens, out)
    ttfts = sorted(t for t, _, _ in out)
    prompt, cached = sum(p for _, p, _ in out), sum(c for _, _, c in out)
    return {"requests": len(out), "hit_rate": cached / prompt if prompt else 0.0,
            "ttft_p50_ms": 1000 * statistics.median(ttfts), "ttft_p99_ms": 1000 * ttfts[int(0.99 * (len(ttfts) - 1))]}


def run_chat(args: argparse.Namespace) -> None:
    rows = []
    runs = [(int(r), p) for r, _, p in (x.partition(":") for x in args.runs.split(","))] if args.runs else \
        [(1, "prefix"), (args.replicas, "prefix"), (args.replicas, "round_robin")]
    with ray_cluster(nodes=max(r for r, _ in runs)) as address, tempfile.TemporaryDirectory() as tmp:
        for replicas, policy in runs:
            with replicated_server(address, args.model, replicas, Path(tmp) / f"{replicas}-{policy}.log",
                                   "--route-policy", policy, "--route-key", args.route_key) as url:
                result = trio.run(chat_load, url, args.conversations, args.max_tokens)
            rows.append((replicas, policy, result))
            print(replicas, policy, result, flush=True)
    print(f"\n{args.conversations} conversations x {len(QUESTIONS)} turns, {args.model}, max_tokens {args.max_tokens}, "
          f"route key {args.route_key}")
    print("replicas policy       hit rate  TTFT p50 ms  TTFT p99 ms")
    for replicas, policy, r in rows:
        print(f"{replicas:>8} {policy:<12} {r['hit_rate']:>8.1%} {r['ttft_p50_ms']:>12.0f} {r['ttft_p99_ms']:>12.0f}")


def run_chaos(args: argparse.Namespace) -> None:
    with ray_cluster(nodes=args.replicas) as address, tempfile.TemporaryDirectory() as tmp:
        # the int8 kernels by default: their greedy text does not depend on the batch or prefix-cache
        # hits (one float order on every int8 path), so it is held to the fault-free text
        extra = ["--no-int8"] if args.no_int8 else []
        with replicated_server(address, args.model, args.replicas, Path(tmp) / "serve.log", *extra) as url:
            r = trio.run(lambda: chaos(url, args.requests, args.concurrency, args.kills, args.replicas,
                                       args.max_tokens))
        log = (Path(tmp) / "serve.log").read_text()
        moved = log.count("request moved")
        midstream = len(re.findall(r"request moved .*tokens_sent=[1-9]", log))
    print(f"{r.requests} requests at concurrency {args.concurrency} over {args.replicas} replicas, "
          f"{r.kills} kills, {r.seconds:.1f} s: {r.finished} finished, {len(r.errors)} errors, "
          f"{moved} moves ({midstream} mid-stream), {len(r.mismatched)} texts differing from the fault-free run")
    for e in r.errors[:5]:
        print("error:", e)
    for p, want, got in r.mismatched[:5]:
        print(f"differs: {p!r}\n  want {want!r}\n  got  {got!r}")
    m = r.metrics_after
    print("after:", {k: v for k, v in m.items() if k.startswith(("zinfer_requests_in_flight", "zinfer_replica_"))})


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("chaos", "chat"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--runs", default="", help="chat: REPLICAS:POLICY,... (default 1:prefix,R:prefix,R:round_robin)")
    ap.add_argument("--route-key", default="text", choices=("text", "tokens"), help="chat: the prefix policy's key")
    ap.add_argument("--no-int8", action="store_true", help="chaos: cpu-fast's float kernels instead of its int8 ones")
    a = ap.parse_args()
    if a.mode == "chat":
        a.max_tokens = a.max_tokens if "--max-tokens" in sys.argv else 24
        run_chat(a)
    else:
        run_chaos(a)
