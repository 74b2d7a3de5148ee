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
from zinfer.gateway.model_facts import ModelFacts
from zinfer.gateway.origins import OriginPolicy
from zinfer.gateway.cli_config import engine_config, trace_config
from zinfer.gateway.serve_replicas import serve_replicated
from zinfer.gateway.state import GatewayState, fingerprint
from zinfer.models.sampling_defaults import sampling_defaults
from zinfer.models.tool_prompt import call_syntax, source_chat_template
from zinfer.traces.windows import merge_windows, parts_dir

log = structlog.get_logger("zinfer.serve")


def serve(args: argparse.Namespace) -> int:
    trace = None
    if getattr(args, "trace_dir", None):
        trace = trace_config(args, str(parts_dir(args.trace_dir)), args.trace_window)
    try:
        if getattr(args, "replicas", 0):
            serve_replicated(args, engine_config(args, trace))
        else:
            trio.run(run_server, args, engine_config(args, trace))
    finally:
        if trace is not None:
            merge_windows(args.trace_dir, trace.window_s, final=True)
    return 0


async def run_server(args: argparse.Namespace, config: EngineConfig) -> None:
    """Serve HTTP at args.host:args.port from an engine started with config, until cancelled."""
    origins = OriginPolicy.from_args(args.host, args.allowed_origins, args.allowed_hosts)
    served = getattr(args, "served_model_name", None)  # names the API uses instead of --model
    state = GatewayState(model_name=served[0] if served else args.model, api_key=args.api_key, origins=origins)
    state.extra["trace_dir"] = getattr(args, "trace_dir", None)  # the chat page's per-answer traces (gateway/page.py)
    state.extra["trace_window"] = getattr(args, "trace_window", 60.0)
    hc = hypercorn.config.Config()
    hc.bind = [f"{args.host}:{args.port}"]
    hc.accesslog = None
    async with trio.open_nursery() as nursery:
        if getattr(args, "trace_dir", None) and config.trace.window_s:
            nursery.start_soon(_merge_trace_windows, args.trace_dir, config.trace.window_s)
        # HTTP first: /health answers 503 while the model loads
        # hypercorn types an app as its own ASGI callable, which Starlette's signature does not match
        await nursery.start(partial(hypercorn.trio.serve, build_app(state), hc))  # type: ignore[arg-type]
        async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
            state.max_model_len = engine.max_model_len
            state.max_waiting = config.max_waiting
            state.model_aliases = set(served[1:]) if served else {str(engine.source.path), engine.source.path.name}
            state.system_fingerprint = fingerprint(str(engine.source.path), engine.config.device)
            # what a compulsory tool call's grammar follows
            state.extra["tool_syntax"] = call_syntax(source_chat_template(engine.source))
            # what llama-server's and Ollama's routes tell about the model and read from its vocabulary
            state.extra["model"] = await trio.to_thread.run_sync(ModelFacts.from_source, engine.source)
            state.extra["max_running"] = config.max_running  # llama-server's slots (/props, /slots)
            state.sampling = sampling_defaults(engine.source)
            state.client = client
            log.warning("serving", url=f"http://{args.host}:{args.port}", zmq=list(config.zmq_endpoints))
            await trio.sleep_forever()


async def _merge_trace_windows(trace_dir: str, window_s: float) -> None:
    """Write each finished trace window to its own file (serve() merges the rest at exit)."""
    while True:
        await trio.sleep(min(window_s, 10.0))
        await trio.to_thread.run_sync(merge_windows, trace_dir, window_s)
