"""The engine: builds the actors of a topology and runs them under one trio nursery.

In the default topology every actor runs in this process over inproc:// sockets of one
zmq.Context. `serve_actor` runs a single actor, so the same code runs each actor in
its own process over ipc:// or tcp:// (see actors/processes.py).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator

import msgspec
import structlog
import trio
import zmq

from zinfer.actors.kv import KvActor
from zinfer.actors.kv_allocator import KVAllocator
from zinfer.actors.sampler import SamplerActor
from zinfer.actors.scheduler import SchedulerActor
from zinfer.actors.scheduler_policy import SchedulerConfig
from zinfer.actors.tokenizer import TokenizerActor
from zinfer.actors.topology import Addresses
from zinfer.devices.config import DeviceConfig, kind_of
from zinfer.devices.registry import check_options, kv_value_bytes, make_device, resolve_device
from zinfer.messages.curve import CurveContext, KeyPair, load_public_keys
from zinfer.models.loader import ModelSource, open_model
from zinfer.models.pull import DEFAULT_MODEL
from zinfer.traces.config import TraceConfig
from zinfer.traces.setup import Tracing, open_tracing

log = structlog.get_logger("zinfer.engine")


class EngineConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything the engine needs to start; validated before any actor starts."""

    model: str = DEFAULT_MODEL
    device: str = "auto"  # auto, cpu / numpy (the oracle), cpu-llama, cpu-fast, cuda, cuda:N (devices/registry.py)
    device_options: DeviceConfig | None = None  # the device's typed options (devices/config.py); None: its defaults
    max_model_len: int = 0  # 0: the model's own context
    block_size: int = 16
    num_blocks: int = 0  # 0: default_kv_blocks (max_running sequences of up to 1024 tokens, one of max_model_len)
    max_running: int = 32
    max_waiting: int = 256
    token_budget: int = 512
    prefix_caching: bool = True
    topology: str = "inproc"  # "inproc": one process; "ipc" / "tcp": an actor per process
    zmq_endpoints: tuple[str, ...] = ()  # public ZeroMQ endpoints of the front door, e.g. tcp://127.0.0.1:5555
    zmq_curve_secret: str = ""  # a .key_secret file: the public endpoints are CURVE servers under it
    zmq_curve_clients: str = ""  # a directory of client .key files: the only clients CURVE lets in
    trace: TraceConfig = msgspec.field(default_factory=TraceConfig)  # off unless a trace dir or OTLP endpoint is set

    def __post_init__(self) -> None:
        kind_of(self.device)  # ValueError naming the known devices

    def with_resolved_device(self) -> "EngineConfig":
        """This config with `device` concrete ("auto" resolved here, logged) and its options
        checked against it (ValueError for options of another device)."""
        name = resolve_device(self.device).name
        check_options(name, self.device_options)
        return msgspec.structs.replace(self, device=name)

    def scheduler_config(self, source: ModelSource) -> SchedulerConfig:
        ctx = self.max_model_len or source.spec.context_length
        if ctx > source.spec.context_length:
            raise ValueError(f"max_model_len {ctx} exceeds the model's context of {source.spec.context_length}")
        blocks = self.num_blocks or default_kv_blocks(self.max_running, ctx, self.block_size)
        cfg = SchedulerConfig(self.max_running, self.max_waiting, self.token_budget, ctx, self.block_size, blocks)
        cfg.validate()
        return cfg


def default_kv_blocks(max_running: int, max_model_len: int, block_size: int) -> int:
    """The KV pool's blocks when --num-blocks is not given: max_running sequences of
    min(max_model_len, 1024) tokens, and never less than one sequence of max_model_len
    (so any prompt the context admits can run). `zinfer run` serves one request
    (max_running 1): a 4096-token pool, 112 MiB of f16 KV on Qwen2.5-Coder-1.5B, where
    32 x 1024 tokens reserved 896 MiB. A request the pool cannot hold is rejected
    (`cannot_fit`, naming the pool) and the engine serves on."""
    per_seq = -(-min(max_model_len, 1024) // block_size)
    return max(max_running * per_seq, -(-max_model_len // block_size))


def public_curve_keys(config: EngineConfig) -> KeyPair | None:
    """The front door's CURVE server key pair, when its public endpoints use CURVE."""
    return KeyPair.load(config.zmq_curve_secret) if config.zmq_curve_secret else None


def engine_context(config: EngineConfig, actor_keys: KeyPair | None = None, actor_endpoints: tuple[str, ...] = ()) -> CurveContext:
    """The zmq context of this process's actors: ZAP for the front door's CURVE clients
    and, with actor_keys, CURVE on every actor endpoint (the tcp topology)."""
    clients = load_public_keys(config.zmq_curve_clients) if config.zmq_curve_clients else None
    return CurveContext(actor_keys=actor_keys, actor_endpoints=actor_endpoints, clients=clients)


def open_process_tracing(config: EngineConfig, source: ModelSource, role: str) -> Tracing | None:
    """This process's Tracing (None when tracing is off); its resource names the model and device."""
    return open_tracing(config.trace, role, {"zinfer.model": source.name, "zinfer.model.file": str(source.path), "zinfer.device": config.device})


def build_actor(name: str, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses, config: EngineConfig, source: ModelSource, tracing: Tracing | None = None) -> Any:
    """Construct one actor of the topology (the executor loads its weights here).

    tracing: the process's Tracing; when None and the config traces, the actor gets a
    Tracing of its own (an actor alone in its process)."""
    sched = config.scheduler_config(source)
    if tracing is None and config.trace.enabled:
        tracing = open_process_tracing(config, source, name)
    if name == "tokenizer":
        from zinfer.models.prompt import PromptBuilder

        return TokenizerActor(
            ctx, addrs, PromptBuilder.from_source(source), sched.max_model_len, public=list(config.zmq_endpoints), public_curve=public_curve_keys(config),
            tracing=tracing, grammar_model=str(source.path), max_waiting=sched.max_waiting)
    if name == "scheduler":
        return SchedulerActor(ctx, addrs, sched, tracing)
    if name == "kv":
        return KvActor(ctx, addrs.kv, sched.num_blocks, sched.block_size, config.prefix_caching, tracing)
    if name == "sampler":
        return SamplerActor(ctx, addrs, source.spec.vocab_size, tracing, source=source)
    if name == "executor":
        from zinfer.actors.executor import ExecutorActor

        return ExecutorActor(ctx, addrs, source, make_device(config.device, config.device_options), sched.num_blocks, sched.block_size, tracing)
    raise ValueError(f"unknown actor {name!r}")


# Start order: receivers before their senders connect matters little to ZeroMQ, but the
# tokenizer (front door) starts last so no request arrives before the rest is ready.
ACTOR_ORDER = ("kv", "sampler", "executor", "scheduler", "tokenizer")


class Engine:
    """A running engine: its context, the front door's address, and what gateways ask of it.

    Gateways read `max_model_len` and `tracing`, never `actors`: which actors live in
    this process differs per topology (inproc: all five; ipc/tcp: the tokenizer and the
    child processes under "processes")."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: Addresses, source: ModelSource, actors: dict[str, Any], config: EngineConfig):
        self.ctx, self.addrs, self.source, self.actors, self.config = ctx, addrs, source, actors, config

    @property
    def max_model_len(self) -> int:
        """The context length every request is checked against (tokens)."""
        return self.config.scheduler_config(self.source).max_model_len

    @property
    def tracing(self) -> Tracing | None:
        """This process's Tracing (the front door's), None when tracing is off."""
        tokenizer: TokenizerActor = self.actors["tokenizer"]
        return tokenizer.tracing

    @property
    def kv_allocator(self) -> KVAllocator:
        """The KV allocator, inproc topology only (tests check its invariants)."""
        kv: KvActor = self.actors["kv"]
        return kv.allocator


@contextlib.asynccontextmanager
async def open_engine(config: EngineConfig = EngineConfig(), addrs: Addresses | None = None) -> AsyncIterator[Engine]:
    """Load the model, start every actor in this process, yield the Engine; stop on exit.

    An actor that raises cancels the rest and the exception propagates out of here.
    """
    config.trace.validate()
    config = config.with_resolved_device()  # children and traces get the concrete device
    if config.topology in ("ipc", "tcp"):
        from zinfer.actors.processes import open_process_engine

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
        for name in ACTOR_ORDER:
            actors[name] = await trio.to_thread.run_sync(build_actor, name, ctx, addrs, config, source, tracing)
        log_start(source, config)
        async with trio.open_nursery() as nursery:
            for name in ACTOR_ORDER:
                await nursery.start(_fail_requests_if_it_raises, name, actors[name], actors["tokenizer"])
            yield Engine(ctx, addrs, source, actors, config)
            nursery.cancel_scope.cancel()
    finally:
        ctx.destroy(linger=0)
        if tracing is not None:
            tracing.close()


async def _fail_requests_if_it_raises(name: str, actor: Any, tokenizer: Any, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run one in-process actor. If it raises, every open request first gets its one terminal
    event (Failed, naming the actor and the error), as an actor process's exit gives them
    (actors/processes.py); then the exception cancels the engine."""
    try:
        await actor.run(task_status=task_status)
    except Exception as exc:
        log.error("actor failed", actor=name, error=f"{type(exc).__name__}: {exc}")
        if name != "tokenizer":
            tokenizer.fail_all(f"{name} failed: {type(exc).__name__}: {exc}")
            with trio.CancelScope(shield=True):
                await trio.sleep(0.2)  # the tokenizer's sender delivers the failures before the nursery cancels it
        raise


def log_start(source: ModelSource, config: EngineConfig) -> None:
    """The start-up line: the model, its file, architecture and quant types, and memory."""
    spec, sched = source.spec, config.scheduler_config(source)
    per_value = kv_value_bytes(config.device, config.device_options)  # cpu-fast keeps K and V in f16 by default, the others f32
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
