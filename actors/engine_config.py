"""EngineConfig: everything an engine needs to start, validated before any actor starts.

Every process of a topology builds its actors from the same EngineConfig (the parent hands
it to each child as JSON: actors/processes.py).
"""

from __future__ import annotations

import msgspec

from zinfer.actors.scheduler_policy import SchedulerConfig
from zinfer.actors.speculation import SpeculationConfig
from zinfer.devices.config import DeviceConfig, kind_of
from zinfer.devices.registry import check_options, resolve_device
from zinfer.models.loader import ModelSource
from zinfer.models.pull import DEFAULT_MODEL
from zinfer.traces.config import TraceConfig


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
    speculation: SpeculationConfig = msgspec.field(default_factory=SpeculationConfig)  # drafts; mode "off": none
    topology: str = "inproc"  # "inproc": one process; "ipc" / "tcp": an actor per process
    zmq_endpoints: tuple[str, ...] = ()  # public ZeroMQ endpoints of the front door, e.g. tcp://127.0.0.1:5555
    zmq_curve_secret: str = ""  # a .key_secret file: the public endpoints are CURVE servers under it
    zmq_curve_clients: str = ""  # a directory of client .key files: the only clients CURVE lets in
    trace: TraceConfig = msgspec.field(default_factory=TraceConfig)  # off unless a trace dir or OTLP endpoint is set

    def __post_init__(self) -> None:
        kind_of(self.device)  # ValueError naming the known devices
        self.speculation.validate()
        if self.speculation.draft_model and self.topology != "inproc":
            raise ValueError("a draft model (--draft-model) runs in the inproc topology only")

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
        cfg = SchedulerConfig(self.max_running, self.max_waiting, self.token_budget, ctx, self.block_size, blocks,
                              self.speculation)
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
