"""`zinfer serve`: the engine and every server in one trio nursery, so shutdown is clean."""

from __future__ import annotations

import argparse
from functools import partial

import hypercorn.config
import hypercorn.trio
import structlog
import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.app import build_app
from zinfer.gateway.client import AsyncClient
from zinfer.gateway.run_command import engine_config
from zinfer.gateway.state import GatewayState

log = structlog.get_logger("zinfer.serve")


def serve(args: argparse.Namespace) -> int:
    trio.run(run_server, args, engine_config(args))
    return 0


async def run_server(args: argparse.Namespace, config: EngineConfig) -> None:
    """Serve HTTP at args.host:args.port from an engine started with config, until cancelled."""
    state = GatewayState(model_name=args.model, api_key=args.api_key)
    hc = hypercorn.config.Config()
    hc.bind = [f"{args.host}:{args.port}"]
    hc.accesslog = None
    async with trio.open_nursery() as nursery:
        # HTTP first: /health answers 503 while the model loads
        await nursery.start(partial(hypercorn.trio.serve, build_app(state), hc))
        async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
            state.max_model_len = engine.actors["scheduler"].policy.config.max_model_len
            state.model_aliases = {str(engine.source.path), engine.source.path.name}
            state.client = client
            log.warning("serving", url=f"http://{args.host}:{args.port}", zmq=list(config.zmq_endpoints))
            await trio.sleep_forever()
