"""`zinfer run`: one generation through an in-process engine, streamed to the terminal."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.devices.config import CpuFastConfig, CpuLlamaConfig, CudaConfig, DeviceConfig
from zinfer.gateway.cli import UsageError
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Failed, Finished, Rejected
from zinfer.messages.params import SamplingParams
from zinfer.traces.config import TraceConfig
from zinfer.traces.merge import write_trace


def trace_config(args: argparse.Namespace, parts_dir: str = "", window_s: float = 0.0) -> TraceConfig:
    """Tracing for the command: part files in parts_dir and/or OTLP; off if neither."""
    return TraceConfig(dir=parts_dir, otlp_endpoint=getattr(args, "otlp_endpoint", None) or "", window_s=window_s)


def device_options(args: argparse.Namespace) -> DeviceConfig | None:
    """The typed options the device flags ask for (None: none given, the device's defaults).
    Flags of two devices together are a UsageError; flags of a device other than the one
    --device resolves to are refused when the engine starts (EngineConfig.with_resolved_device)."""
    fast = {k: v for k, v in (("threads", args.threads), ("int8", False if args.no_int8 else None), ("kv_f16", False if args.kv_f32 else None),
                                      ("decode_graphs", False if getattr(args, "no_decode_graphs", False) else None)) if v is not None}
    cuda = {"cuda_graphs": args.cuda_graphs} if args.cuda_graphs is not None else {}
    llama = {"repack": False} if getattr(args, "no_repack", False) else {}
    if sum(map(bool, (fast, cuda, llama))) > 1:
        raise UsageError("--threads, --no-int8, --kv-f32 and --no-decode-graphs are cpu-fast options, --cuda-graphs a cuda one, --no-repack a cpu-llama one: give one device's")
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
        zmq_endpoints=(args.zmq,) if getattr(args, "zmq", None) else (),
        zmq_curve_secret=getattr(args, "zmq_curve_secret", None) or "",
        zmq_curve_clients=getattr(args, "zmq_curve_clients", None) or "",
        trace=trace or trace_config(args),
    )


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    p = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty if args.repetition_penalty is not None else (1.1 if args.temperature > 0 else 1.0),
        seed=args.seed,
        max_tokens=args.max_tokens,
    )
    p.validate()
    return p


def run(args: argparse.Namespace) -> int:
    """Generate; with --trace, every process's spans are merged into that file at the end."""
    if not args.trace:
        return trio.run(_run, args, engine_config(args), sampling_params(args))
    with tempfile.TemporaryDirectory(prefix="zinfer-trace-") as parts:
        try:
            return trio.run(_run, args, engine_config(args, trace_config(args, parts)), sampling_params(args))
        finally:
            slices = write_trace(parts, args.trace)
            print(f"zinfer: wrote {slices} trace slices to {args.trace} (open it at https://ui.perfetto.dev)", file=sys.stderr)


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
