"""`zinfer serve --replicas N` and `zinfer stdio --replicas N`: the gateway's transports in
front of a router over N engine replicas that Ray places and restarts (gateway/replicas.py,
gateway/router.py).

Everything a single-engine serve offers is here too: HTTP (OpenAI and the other protocols),
the websocket chat, `--zmq` (the router's front door speaks the engine's client protocol),
/metrics (each replica's gauges labelled by replica) and, for stdio, the JSON-lines relay
on the router's front door. The gateway process loads the model's tokenizer and template
only (it routes on token ids and continues moved streams); the replicas load the weights.
On shutdown the router drains every replica before Ray stops them; each SIGUSR1 to a
serving process, or POST /admin/replicas/scale-down, scales down the same way
(gateway/replica_admin.py).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
from functools import partial
from typing import AsyncIterator

import hypercorn.config
import hypercorn.trio
import structlog
import trio

from zinfer.actors.engine import EngineConfig
from zinfer.gateway.app import build_app
from zinfer.gateway.cli_config import engine_config, replica_options, router_options
from zinfer.gateway.model_facts import ModelFacts
from zinfer.gateway.origins import OriginPolicy
from zinfer.gateway.replica_admin import OPEN_ADMIN, SCALER, ReplicaScaler, scale_down_on_signal
from zinfer.gateway.replicas import RayReplicas
from zinfer.gateway.router import Router, RouterOptions
from zinfer.gateway.router_front_door import RouterFrontDoor
from zinfer.gateway.state import GatewayState, fingerprint
from zinfer.gateway.stdio import Ready, StdioRelay
from zinfer.messages.curve import CurveContext, KeyPair, load_public_keys
from zinfer.models.loader import ModelSource, open_model
from zinfer.models.sampling_defaults import sampling_defaults
from zinfer.models.tool_prompt import call_syntax, source_chat_template
from zinfer.traces.setup import open_tracing

log = structlog.get_logger("zinfer.serve")


def connect_replicas(args: argparse.Namespace, config: EngineConfig) -> tuple[RayReplicas, EngineConfig]:
    """The replicas of config's engine, connected to Ray on this (the main) thread."""
    config = config.with_resolved_device() if config.device == "auto" else config
    replicas = RayReplicas(replica_options(args, config), config)
    replicas.connect()
    return replicas, config


def serve_replicated(args: argparse.Namespace, config: EngineConfig) -> None:
    """Connect to Ray on this thread, then serve HTTP (and --zmq) until interrupted."""
    replicas, config = connect_replicas(args, config)
    trio.run(run_replicated_server, args, config, replicas)


def stdio_replicated(args: argparse.Namespace, protocol_fd: int) -> None:
    """`zinfer stdio --replicas N`: connect to Ray on this thread, then relay the JSON lines of
    stdin and protocol_fd through the router."""
    replicas, config = connect_replicas(args, engine_config(args))
    trio.run(_stdio, args, config, replicas, protocol_fd)


@contextlib.asynccontextmanager
async def open_replica_router(
    config: EngineConfig, replicas: RayReplicas, options: RouterOptions, ctx: CurveContext, facts: ModelFacts,
) -> AsyncIterator[Router]:
    """Start the replicas and yield the router once one is up; on exit, drain every replica
    (each finishes what it runs) and stop Ray's actors."""
    tracing = open_tracing(config.trace, "router", {"zinfer.model": facts.name})
    try:
        await trio.to_thread.run_sync(replicas.start)
        async with Router(ctx, replicas, options, facts.prompts, replicas.client_keys, tracing) as router:
            await router.wait_up(1)
            try:
                yield router
            finally:
                with trio.CancelScope(shield=True):
                    await router.drain_all()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(replicas.close)
        if tracing is not None:
            tracing.close()


async def _model(config: EngineConfig) -> tuple[ModelSource, ModelFacts]:
    source = await trio.to_thread.run_sync(open_model, config.model)
    return source, await trio.to_thread.run_sync(ModelFacts.from_source, source)


def _context(config: EngineConfig) -> CurveContext:
    """The router's zmq context: ZAP with --zmq-curve-clients' keys for a CURVE --zmq endpoint."""
    return CurveContext(clients=load_public_keys(config.zmq_curve_clients) if config.zmq_curve_clients else None)


async def run_replicated_server(args: argparse.Namespace, config: EngineConfig, replicas: RayReplicas) -> None:
    """Serve HTTP (and --zmq) at args.host:args.port from the replicas of config's engine,
    until cancelled; then drain them and stop Ray's actors."""
    origins = OriginPolicy.from_args(args.host, args.allowed_origins, args.allowed_hosts)
    served = getattr(args, "served_model_name", None)
    state = GatewayState(model_name=served[0] if served else args.model, api_key=args.api_key, origins=origins)
    state.extra["trace_dir"] = getattr(args, "trace_dir", None)
    state.extra["trace_window"] = getattr(args, "trace_window", 60.0)
    hc = hypercorn.config.Config()
    hc.bind = [f"{args.host}:{args.port}"]
    hc.accesslog = None
    options = router_options(args, config)
    ctx = _context(config)
    try:
        async with trio.open_nursery() as nursery:
            # hypercorn types an app as its own ASGI callable, which Starlette's signature does not match
            await nursery.start(partial(hypercorn.trio.serve, build_app(state), hc))  # type: ignore[arg-type]
            source, facts = await _model(config)
            async with open_replica_router(config, replicas, options, ctx, facts) as router:
                state.max_model_len = config.scheduler_config(source).max_model_len
                state.max_waiting = config.max_waiting
                state.model_aliases = set(served[1:]) if served else {str(source.path), source.path.name}
                state.system_fingerprint = fingerprint(str(source.path), config.device)
                state.extra["tool_syntax"] = call_syntax(source_chat_template(source))
                state.extra["model"] = facts
                state.sampling = sampling_defaults(source)
                state.metrics.replicas = router.replica_stats
                state.client = router
                if config.zmq_endpoints:
                    keys = KeyPair.load(config.zmq_curve_secret) if config.zmq_curve_secret else None
                    await nursery.start(RouterFrontDoor(ctx, router, config.zmq_endpoints, keys).run)
                log.warning("serving", url=f"http://{args.host}:{args.port}", zmq=list(config.zmq_endpoints),
                            replicas=router.up)
                scaler = ReplicaScaler(router, nursery)
                state.extra[SCALER] = scaler
                state.extra[OPEN_ADMIN] = bool(getattr(args, "admin_without_key", False))
                nursery.start_soon(scale_down_on_signal, scaler, SCALE_DOWN_SIGNAL)
                try:
                    await trio.sleep_forever()
                finally:
                    state.client = None  # new requests get 503 while the replicas drain
                    state.extra.pop(SCALER, None)
    finally:
        ctx.destroy(linger=0)


SCALE_DOWN_SIGNAL = signal.SIGUSR1
"""Each one drains one replica for good (ReplicaScaler.scale_down)."""


async def _stdio(args: argparse.Namespace, config: EngineConfig, replicas: RayReplicas, protocol_fd: int) -> None:
    ctx = _context(config)
    try:
        source, facts = await _model(config)
        async with open_replica_router(config, replicas, router_options(args, config), ctx, facts) as router, \
                trio.open_nursery() as nursery:
            door = RouterFrontDoor(ctx, router)
            await nursery.start(door.run)
            ready = Ready(model=source.name, max_model_len=config.scheduler_config(source).max_model_len)
            log.info("stdio ready", model=ready.model, replicas=router.up)
            await StdioRelay(ctx, door.address, 0, protocol_fd).run(ready)
            nursery.cancel_scope.cancel()
    finally:
        ctx.destroy(linger=0)
