"""Structured-output acceptance of issue #17: --count varied pydantic models
(tests/structured_schemas.py) asked for at temperature 0.8 through the official openai
client, response_format json_schema with strict: true, against a real `zinfer serve`.

One line per schema: its name, finish_reason, whether the output parses and validates
(pydantic's model_validate_json), completion tokens, and for a failure the output's last
200 characters and pydantic's first complaint; then the counts. --out writes every
output (schema, text, finish_reason, tokens) as JSON for a closer look.

    python tests/benchmarks/schema_acceptance.py --model qwen2.5-coder-0.5b [--count 50] [--max-tokens 800]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from http_server import running_server  # noqa: E402
from structured_schemas import ask_messages, models  # noqa: E402

from zinfer.models.pull import cached_path, pull  # noqa: E402


def ask(client: openai.OpenAI, served: str, i: int, m, max_tokens: int) -> dict:
    """One schema's request; what came back and whether it validates."""
    schema = m.model_json_schema()
    r = client.chat.completions.create(
        model=served, temperature=0.8, seed=i, max_tokens=max_tokens, messages=ask_messages(m),
        response_format={"type": "json_schema", "json_schema": {"name": m.__name__, "schema": schema, "strict": True}},
    )
    choice = r.choices[0]
    text = choice.message.content or ""
    try:
        m.model_validate_json(text)
        error = None
    except Exception as exc:  # pydantic's ValidationError, or a parse error inside it
        error = str(exc).splitlines()[0:3]
    return {"name": m.__name__, "schema": schema, "finish_reason": choice.finish_reason, "valid": error is None,
            "tokens": r.usage.completion_tokens, "text": text, "error": error}


def report(r: dict) -> dict:
    """Print r's line (as it finishes: a long run shows its progress) and return it."""
    line = f"{r['name']:8s} {r['finish_reason']:6s} {'valid' if r['valid'] else 'INVALID':7s} {r['tokens']:4d} tokens"
    if not r["valid"]:
        line += f"  ...{r['text'][-200:]!r}  {r['error']}"
    print(line, flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=800)
    ap.add_argument("--max-running", type=int, default=8)
    ap.add_argument("--device", default="cpu-fast")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    path = cached_path(args.model) or pull(args.model, quiet=True)
    drawn = models(args.count)
    t0 = time.perf_counter()
    with running_server(path, "--device", args.device, "--max-running", str(args.max_running), timeout=600) as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=3600) as client:
            with ThreadPoolExecutor(args.max_running) as pool:
                futures = [pool.submit(ask, client, server.model, i, m, args.max_tokens) for i, m in enumerate(drawn)]
                results = [report(f.result()) for f in as_completed(futures)]
    valid = sum(r["valid"] for r in results)
    cut = sum(r["finish_reason"] == "length" for r in results)
    print(f"{args.model} {args.device}: {valid}/{args.count} outputs parse and validate "
          f"({cut} cut by max_tokens {args.max_tokens}), "
          f"{sum(r['tokens'] for r in results)} tokens, {time.perf_counter() - t0:.0f} s", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
