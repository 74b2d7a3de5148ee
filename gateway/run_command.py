"""`zinfer run`: one generation through an in-process engine, streamed to the terminal."""

from __future__ import annotations

import argparse
import json
import sys

import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.cli import UsageError
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Failed, Finished, Rejected
from zinfer.messages.params import SamplingParams


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        device=args.device,
        max_model_len=args.max_model_len,
        max_running=args.max_running,
        num_blocks=args.num_blocks,
        zmq_endpoints=(args.zmq,) if getattr(args, "zmq", None) else (),
    )


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    p = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
    )
    p.validate()
    return p


def run(args: argparse.Namespace) -> int:
    return trio.run(_run, args, engine_config(args), sampling_params(args))


async def _run(args: argparse.Namespace, config: EngineConfig, params: SamplingParams) -> int:
    async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        form = {"prompt": args.prompt} if args.raw else {"messages": [{"role": "user", "content": args.prompt}]}
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
                    print(json.dumps({"prompt_ids": event.prompt_ids, "token_ids": token_ids, "text": "".join(text)}, ensure_ascii=False))
                else:
                    sys.stdout.write("\n")
                return 0
            elif isinstance(event, (Rejected, Failed)):
                raise UsageError(event.message)
    return 1
