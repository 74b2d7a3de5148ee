"""The command line's flags as the engine's typed configs, for every engine command (run,
serve, stdio, bench); a combination no config can hold is a UsageError."""

from __future__ import annotations

import argparse

import msgspec

from zinfer.actors.engine import EngineConfig, SpeculationConfig
from zinfer.gateway.replicas import ReplicaOptions, replica_resources
from zinfer.gateway.router import RouterOptions
from zinfer.gateway.router_policy import RoutePolicy
from zinfer.devices.config import CpuFastConfig, CpuLlamaConfig, CudaConfig, DeviceConfig
from zinfer.messages.params import SamplingParams
from zinfer.traces.config import TraceConfig


class UsageError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


def trace_config(args: argparse.Namespace, parts_dir: str = "", window_s: float = 0.0) -> TraceConfig:
    """Tracing for the command: part files in parts_dir and/or OTLP; off if neither."""
    return TraceConfig(dir=parts_dir, otlp_endpoint=getattr(args, "otlp_endpoint", None) or "", window_s=window_s)


def device_options(args: argparse.Namespace) -> DeviceConfig | None:
    """The typed options the device flags ask for (None: none given, the device's defaults).
    Flags of two devices together are a UsageError; flags of a device other than the one
    --device resolves to are refused when the engine starts (EngineConfig.with_resolved_device)."""
    flags = (("threads", args.threads), ("int8", False if args.no_int8 else None),
             ("kv_f16", False if args.kv_f32 else None),
             ("decode_graphs", False if getattr(args, "no_decode_graphs", False) else None))
    fast = {k: v for k, v in flags if v is not None}
    cuda = {"cuda_graphs": args.cuda_graphs} if args.cuda_graphs is not None else {}
    llama = {"repack": False} if getattr(args, "no_repack", False) else {}
    if sum(map(bool, (fast, cuda, llama))) > 1:
        raise UsageError("--threads, --no-int8, --kv-f32 and --no-decode-graphs are cpu-fast options, "
                         "--cuda-graphs a cuda one, --no-repack a cpu-llama one: give one device's")
    if fast:
        return CpuFastConfig(**fast)
    if llama:
        return CpuLlamaConfig(**llama)
    return CudaConfig(**cuda) if cuda else None


def engine_config(args: argparse.Namespace, trace: TraceConfig | None = None) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        device=args.device,
        device_options=device_options(args),
        max_model_len=args.max_model_len,
        max_running=args.max_running,
        max_waiting=args.max_waiting,
        topology=args.topology,
        num_blocks=args.num_blocks,
        speculation=speculation_config(args),
        zmq_endpoints=(args.zmq,) if getattr(args, "zmq", None) else (),
        zmq_curve_secret=getattr(args, "zmq_curve_secret", None) or "",
        zmq_curve_clients=getattr(args, "zmq_curve_clients", None) or "",
        trace=trace or trace_config(args),
    )


def speculation_config(args: argparse.Namespace) -> SpeculationConfig:
    """--speculate and its limits (defaults where a command has no such flags); bad values are a UsageError."""
    d = SpeculationConfig()
    config = SpeculationConfig(
        mode=getattr(args, "speculate", d.mode),
        max_draft=getattr(args, "speculate_max_draft", d.max_draft),
        draft_max=getattr(args, "draft_max", d.draft_max),
        max_batch=getattr(args, "speculate_max_batch", d.max_batch),
        draft_model=getattr(args, "draft_model", "") or "",
        draft_p_min=getattr(args, "draft_p_min", d.draft_p_min),
        draft_head=getattr(args, "draft_head", d.draft_head),
    )
    try:
        config.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return config


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    p = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=(args.repetition_penalty if args.repetition_penalty is not None
                            else 1.1 if args.temperature > 0 else 1.0),
        seed=args.seed,
        max_tokens=args.max_tokens,
    )
    p.validate()
    return p


def replica_options(args: argparse.Namespace, config: EngineConfig) -> ReplicaOptions:
    """`serve --replicas N`: how many, where (--ray-address) and the resources each asks Ray for."""
    cpus, gpus = replica_resources(config)
    options = ReplicaOptions(replicas=args.replicas, ray_address=args.ray_address or "", num_cpus=cpus, num_gpus=gpus)
    options.validate()
    return options


def router_options(args: argparse.Namespace, config: EngineConfig) -> RouterOptions:
    """`serve --replicas N`: the router's policy (--route-*); its block size is the engine's.
    --route-weights is "open=1,waiting=1,kv=4" (any of them); a bad one is a UsageError."""
    weights: dict[str, float] = {}
    for item in filter(None, (args.route_weights or "").split(",")):
        name, _, value = item.partition("=")
        if name.strip() not in ("open", "waiting", "kv"):
            raise UsageError(f"--route-weights: {name.strip()!r} is not one of open, waiting, kv")
        try:
            weights["w_" + name.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--route-weights: {item!r} is not NAME=NUMBER") from None
    policy = msgspec.structs.replace(
        RoutePolicy(kind=args.route_policy, prefix_blocks=args.route_prefix_blocks, block_size=config.block_size,
                    load_bound=args.route_load_bound, key=getattr(args, "route_key", "text")), **weights)
    options = RouterOptions(policy=policy)
    options.validate()
    return options
