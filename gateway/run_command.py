"""`zinfer run`: one generation through an in-process engine, streamed to the terminal."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.cli_config import UsageError, engine_config, sampling_params, trace_config
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Failed, Finished, Rejected
from zinfer.messages.params import SamplingParams
from zinfer.traces.merge import write_trace


def run(args: argparse.Namespace) -> int:
    """Generate; with --trace, every process's spans are merged into that file at the end."""
    if not args.trace:
        return trio.run(_run, args, engine_config(args), sampling_params(args))
    with tempfile.TemporaryDirectory(prefix="zinfer-trace-") as parts:
        try:
            return trio.run(_run, args, engine_config(args, trace_config(args, parts)), sampling_params(args))
        finally:
            slices = write_trace(parts, args.trace)
            print(f"zinfer: wrote {slices} trace slices to {args.trace} (open it at https://ui.perfetto.dev)",
                  file=sys.stderr)


async def _run(args: argparse.Namespace, config: EngineConfig, params: SamplingParams) -> int:
    async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        chat = {"messages": [{"role": "user", "content": args.prompt}]}
        form: dict[str, Any] = {"prompt": args.prompt} if args.raw else chat
        token_ids: list[int] = []
        text: list[str] = []
        async for event in client.generate(**form, params=params):
            if isinstance(event, Delta):
                token_ids += event.token_ids
                text.append(event.text)
                if not args.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            elif isinstance(event, Finished):
                if args.json:
                    out = {"prompt_ids": event.prompt_ids, "token_ids": token_ids, "text": "".join(text)}
                    print(json.dumps(out, ensure_ascii=False))
                else:
                    sys.stdout.write("\n")
                return 0
            elif isinstance(event, (Rejected, Failed)):
                raise UsageError(event.message)
    return 1
