"""The engine: builds the actors of a topology and runs them under one trio nursery.

In the default topology every actor runs in this process over inproc:// sockets of one
zmq.Context. In the ipc and tcp topologies each actor but the front door runs in its own
process (actors/processes.py); actors/engine_build.py builds each process's actors.

The engine's public face is this module: `open_engine`, the `EngineConfig` it takes and
the `Engine` it yields.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator

import structlog
import trio

from zinfer.actors.engine_build import Engine, actor_order, build_actor, engine_context, open_process_tracing
from zinfer.actors.engine_config import EngineConfig
from zinfer.actors.front_door_actor import FrontDoorActor
from zinfer.actors.processes import open_process_engine
from zinfer.actors.speculation import SpeculationConfig
from zinfer.actors.topology import Addresses
from zinfer.devices.registry import kv_value_bytes
from zinfer.models.loader import ModelSource, open_model

__all__ = ["Engine", "EngineConfig", "SpeculationConfig", "open_engine"]

log = structlog.get_logger("zinfer.engine")


# Start order: receivers before their senders connect matters little to ZeroMQ, but the
# front door starts last so no request arrives before the rest is ready.
ACTOR_ORDER = ("kv", "sampler", "executor", "scheduler", "front_door")


@contextlib.asynccontextmanager
async def open_engine(config: EngineConfig = EngineConfig(), addrs: Addresses | None = None) -> AsyncIterator[Engine]:
    """Load the model, start every actor in this process, yield the Engine; stop on exit.

    An actor that raises cancels the rest and the exception propagates out of here.
    """
    config.trace.validate()
    config = config.with_resolved_device()  # children and traces get the concrete device
    if config.topology in ("ipc", "tcp"):
        async with open_process_engine(config, config.topology) as engine:
            tracing = engine.tracing
            try:
                log_start(engine.source, config)
                yield engine
            finally:
                if tracing is not None:
                    tracing.close()
        return
    if config.topology != "inproc":
        raise ValueError(f"unknown topology {config.topology!r} (inproc, ipc, tcp)")
    source = await trio.to_thread.run_sync(open_model, config.model)
    ctx = engine_context(config)
    addrs = addrs or Addresses.inproc()
    tracing = open_process_tracing(config, source, "engine")
    try:
        actors = {}
        names = actor_order(config, ACTOR_ORDER)  # and the drafter, with a draft model
        for name in names:
            actors[name] = await trio.to_thread.run_sync(build_actor, name, ctx, addrs, config, source, tracing)
        log_start(source, config)
        async with trio.open_nursery() as nursery:
            for name in names:
                await nursery.start(_fail_requests_if_it_raises, name, actors[name], actors["front_door"])
            yield Engine(ctx, addrs, source, actors, config)
            nursery.cancel_scope.cancel()
    finally:
        ctx.destroy(linger=0)
        if tracing is not None:
            tracing.close()


async def _fail_requests_if_it_raises(
    name: str,
    actor: Any,
    front_door: FrontDoorActor,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one in-process actor. If it raises, every open request first gets its one terminal
    event (Failed, naming the actor and the error), as an actor process's exit gives them
    (actors/processes.py); then the exception cancels the engine."""
    try:
        await actor.run(task_status=task_status)
    except Exception as exc:
        log.error("actor failed", actor=name, error=f"{type(exc).__name__}: {exc}")
        if name != "front_door":
            front_door.fail_all(f"{name} failed: {type(exc).__name__}: {exc}")
            with trio.CancelScope(shield=True):
                # the front door's sender delivers the failures before the nursery cancels it
                await trio.sleep(0.2)
        raise


def log_start(source: ModelSource, config: EngineConfig) -> None:
    """The start-up line: the model, its file, architecture and quant types, and memory."""
    spec, sched = source.spec, config.scheduler_config(source)
    # bytes per K or V value: cpu-fast keeps K and V in f16 by default, the others f32
    per_value = kv_value_bytes(config.device, config.device_options)
    kv_bytes = 2 * spec.n_layers * sched.num_blocks * sched.block_size * spec.n_kv_heads * spec.head_dim * per_value
    warn_if_context_outgrows_memory(sched.max_model_len, kv_bytes // max(1, sched.num_blocks * sched.block_size))
    log.info(
        "engine started",
        model=source.name,
        file=str(source.path),
        arch=spec.arch,
        quant_types=source.quant_types,
        params_m=round(source.n_params / 1e6, 1),
        weights_mib=round(sum(t.data.nbytes for t in source.tensors.values()) / 2**20, 1),
        kv_mib=round(kv_bytes / 2**20, 1),
        kv_blocks=sched.num_blocks,
        block_size=sched.block_size,
        max_model_len=sched.max_model_len,
        model_context=spec.context_length,
        device=config.device,
        topology=config.topology,
        tracing=config.trace.enabled,
    )


def warn_if_context_outgrows_memory(max_model_len: int, kv_bytes_per_token: int) -> None:
    """A warning line when one sequence of the whole context would need more KV memory than
    half this machine has: the pool's pages are only touched as tokens arrive, so the engine
    starts, but a prompt that long would not fit; --max-model-len sets a smaller context."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    need = max_model_len * kv_bytes_per_token
    if need > total // 2:
        log.warning("context outgrows memory", max_model_len=max_model_len, kv_gib_per_sequence=round(need / 2**30, 1),
                    memory_gib=round(total / 2**30, 1), hint="--max-model-len sets a smaller context")
