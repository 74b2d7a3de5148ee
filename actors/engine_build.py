"""How one process builds its share of an engine: the zmq context, each actor of the
topology, and the Engine handle that gateways hold.

The in-process engine (actors/engine.py) builds all five actors here (six with a draft model:
the drafter, actors/draft_actor.py); in the ipc and tcp
topologies the parent builds the front door and each child process one other actor
(actors/processes.py), from the same EngineConfig.
"""

from __future__ import annotations

from typing import Any

import zmq

from zinfer.actors.draft_actor import DrafterActor, drafter_address
from zinfer.actors.engine_config import EngineConfig
from zinfer.actors.executor_actor import ExecutorActor
from zinfer.actors.front_door_actor import FrontDoorActor
from zinfer.actors.kv_actor import KvActor
from zinfer.actors.sampler_actor import SamplerActor
from zinfer.actors.scheduler_actor import SchedulerActor
from zinfer.actors.topology import Addresses
from zinfer.devices.registry import make_device
from zinfer.messages.curve import CurveContext, KeyPair, load_public_keys
from zinfer.models.loader import ModelSource, open_model
from zinfer.models.prompt import PromptBuilder
from zinfer.traces.setup import Tracing, open_tracing


def public_curve_keys(config: EngineConfig) -> KeyPair | None:
    """The front door's CURVE server key pair, when its public endpoints use CURVE."""
    return KeyPair.load(config.zmq_curve_secret) if config.zmq_curve_secret else None


def engine_context(
    config: EngineConfig, actor_keys: KeyPair | None = None, actor_endpoints: tuple[str, ...] = ()
) -> CurveContext:
    """The zmq context of this process's actors: ZAP for the front door's CURVE clients
    and, with actor_keys, CURVE on every actor endpoint (the tcp topology)."""
    clients = load_public_keys(config.zmq_curve_clients) if config.zmq_curve_clients else None
    return CurveContext(actor_keys=actor_keys, actor_endpoints=actor_endpoints, clients=clients)


def open_process_tracing(config: EngineConfig, source: ModelSource, role: str) -> Tracing | None:
    """This process's Tracing (None when tracing is off); its resource names the model and device."""
    resource = {"zinfer.model": source.name, "zinfer.model.file": str(source.path), "zinfer.device": config.device}
    return open_tracing(config.trace, role, resource)


def actor_order(config: EngineConfig, order: tuple[str, ...]) -> tuple[str, ...]:
    """order with the drafter before the scheduler when the config has a draft model."""
    if not config.speculation.draft_model:
        return order
    i = order.index("scheduler")
    return order[:i] + ("drafter",) + order[i:]


def build_actor(
    name: str, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses, config: EngineConfig, source: ModelSource,
    tracing: Tracing | None = None,
) -> Any:
    """Construct one actor of the topology (the executor loads its weights here).

    tracing: the process's Tracing; when None and the config traces, the actor gets a
    Tracing of its own (an actor alone in its process)."""
    sched = config.scheduler_config(source)
    if tracing is None and config.trace.enabled:
        tracing = open_process_tracing(config, source, name)
    if name == "front_door":
        return FrontDoorActor(
            ctx, addrs, PromptBuilder.from_source(source), sched.max_model_len, public=list(config.zmq_endpoints),
            public_curve=public_curve_keys(config), tracing=tracing, grammar_model=str(source.path),
            max_waiting=sched.max_waiting)
    if name == "scheduler":
        return SchedulerActor(ctx, addrs, sched, tracing)
    if name == "kv":
        return KvActor(ctx, addrs.kv, sched.num_blocks, sched.block_size, config.prefix_caching, tracing)
    if name == "sampler":
        return SamplerActor(ctx, addrs, source.spec.vocab_size, tracing, source=source)
    if name == "executor":
        device = make_device(config.device, config.device_options)
        return ExecutorActor(ctx, addrs, source, device, sched.num_blocks, sched.block_size, tracing)
    if name == "drafter":
        spec = config.speculation
        device = make_device(config.device, config.device_options)
        # the draft pool holds every running sequence and its proposal past the target's pool
        blocks = sched.num_blocks + sched.max_running * (1 + -(-spec.draft_max // sched.block_size))
        return DrafterActor(ctx, drafter_address(addrs), source, open_model(spec.draft_model), device, blocks,
                            sched.block_size, sched.token_budget, spec.draft_p_min, spec.draft_head, tracing)
    raise ValueError(f"unknown actor {name!r}")


class Engine:
    """A running engine: its context, the front door's address, and what gateways ask of it.

    Gateways read `max_model_len` and `tracing`, never `actors`: which actors live in
    this process differs per topology (inproc: all five; ipc/tcp: the front door and the
    child processes under "processes")."""

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses, source: ModelSource, actors: dict[str, Any],
        config: EngineConfig,
    ):
        self.ctx, self.addrs, self.source, self.actors, self.config = ctx, addrs, source, actors, config

    @property
    def max_model_len(self) -> int:
        """The context length every request is checked against (tokens)."""
        return self.config.scheduler_config(self.source).max_model_len

    @property
    def tracing(self) -> Tracing | None:
        """This process's Tracing (the front door's), None when tracing is off."""
        front_door: FrontDoorActor = self.actors["front_door"]
        return front_door.tracing
