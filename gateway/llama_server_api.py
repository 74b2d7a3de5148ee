"""llama-server's native API: POST /completion and /infill (whole or streamed), /apply-template,
GET /props and /slots, in llama-server's error shape ({"error": {"code", "message", "type"}}).
/tokenize (with_pieces) and /detokenize live beside the OpenAI routes (gateway/openai_api.py),
/health in gateway/app.py.

A generation is checked as a llama-server body (gateway/llama_server_schema.py), turned into
the OpenAI completion request's SamplingParams and constraint, and run through the same
machinery as the OpenAI routes: metrics record, engine events, refusal before the 200,
cancellation when the client leaves. /infill's prompt is made from the model's FIM tokens
(gateway/infill_prompt.py); a model without them gets a 400. Its generation also ends at the
model's FIM pad, repo and file separator tokens (llama.cpp's end-of-generation set has them),
and where the middle reaches the hole's end (stop_at_suffix); n_indent and t_max_predict_ms
are applied to both routes (gateway/llama_server_stops.py).

zinfer has no slots: /slots lists `--max-running` of them, the first as many as run now
busy; id_slot is accepted and has no effect.
"""

from __future__ import annotations

import uuid
from functools import partial
from importlib.metadata import version
from typing import Any

import msgspec
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zinfer.gateway.client import EngineError
from zinfer.gateway.error_shapes import LlamaServerError, reshaped
from zinfer.gateway.infill_prompt import ExtraFile, facts, infill_ids
from zinfer.gateway.llama_server_schema import SAMPLER_LETTERS, CompletionBody, completion_request, prompt_parts
from zinfer.gateway.llama_server_shaper import LlamaServerShaper, settings
from zinfer.gateway.llama_server_stops import StreamCut, SuffixStop, cut_events
from zinfer.gateway.metrics import RequestRecord
from zinfer.gateway.openai_api import (
    OpenEvents,
    answer,
    constrained,
    engine_events,
    generate,
    read_body,
    tool_syntax,
)
from zinfer.gateway.openai_constraints import constraint_field, constraint_from_request
from zinfer.gateway.openai_schema import ApiError, ChatRequest, chat_messages, parse, sampling_params
from zinfer.gateway.openai_tools import tool_plan
from zinfer.gateway.protocol_events import Progress, watched
from zinfer.gateway.state import GatewayState

APPLIED_ORDER = ["penalties", "temperature", "top_k", "top_p", "min_p"]  # actors/sampling.py


def routes(state: GatewayState) -> list[Route]:
    async def completion(request: Request) -> Response:
        return await generate(state, request, CompletionBody, partial(respond, infill=False))

    async def infill(request: Request) -> Response:
        return await generate(state, request, CompletionBody, partial(respond, infill=True))

    async def apply_template(request: Request) -> Response:
        try:
            return JSONResponse({"prompt": await rendered(state, request)})
        except ApiError as exc:
            return reshaped(exc, LlamaServerError).response()

    async def props(request: Request) -> Response:
        return JSONResponse(props_body(state))

    async def slots(request: Request) -> Response:
        try:
            return JSONResponse(await slots_body(state))
        except ApiError as exc:
            return reshaped(exc, LlamaServerError).response()

    return [
        Route("/completion", completion, methods=["POST"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/props", props, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
    ]


async def respond(
    state: GatewayState, request: Request, kind: type[CompletionBody], record: RequestRecord, infill: bool
) -> Response:
    """Validate, then answer whole, or hand back a LiveStream to send."""
    try:
        f = facts(state)
        body = parse(await read_body(request, state.max_body_bytes), kind)
        if infill and not isinstance(body.prompt, (str, type(None))):
            raise ApiError(400, "an infill's prompt is a string (added after input_prefix)", param="prompt")
        parts = None if infill else prompt_parts(body.prompt)
        req = completion_request(body, "")
        params = sampling_params(req, state.max_model_len, state.sampling)
        if req.max_tokens is None:  # n_predict -1: up to the context
            params = msgspec.structs.replace(params, max_tokens=state.max_model_len)
        params = constrained(params, constraint_from_request(req), None)
        if parts is None:
            extra = tuple(ExtraFile(c.filename, c.text) for c in body.input_extra)
            ids = await infill_ids(state, body.input_prefix, body.input_suffix, extra, body.prompt or "")
            form: dict[str, Any] = {"prompt_ids": ids}
            if f.fim is not None and f.fim.ends:  # llama.cpp ends a generation at them
                params = msgspec.structs.replace(params, stop_token_ids=[*params.stop_token_ids, *f.fim.ends])
        else:
            form = await prompt_form(state, parts)
        cut = stream_cut(body, infill)
        prompt_text = form["prompt"] if "prompt" in form else await state.engine().detokenize(form["prompt_ids"])
    except ApiError as exc:
        record.finish("rejected")
        return reshaped(exc, LlamaServerError).response()
    except EngineError as exc:
        record.finish("rejected")
        return LlamaServerError(400, str(exc), param="prompt").response()
    rid, progress = uuid.uuid4().hex, Progress()
    n_predict = body.n_predict if body.n_predict is not None else body.max_tokens or -1
    chosen = [n for n in APPLIED_ORDER if body.samplers is None or n in _names(body.samplers)]
    ran_with = {**settings(params, n_predict, chosen), "n_indent": body.n_indent,
                "t_max_predict_ms": body.t_max_predict_ms}
    if infill:
        ran_with["stop_at_suffix"] = body.stop_at_suffix is not False
    shaper = LlamaServerShaper(state, f, params, progress, prompt_text, ran_with,
                               body.return_tokens, body.timings_per_token, constraint_field(req), cut,
                               body.response_fields)
    open_events: OpenEvents = partial(engine_events, state.engine(), [form], params, rid, record)
    if cut is not None:
        open_events = cut_events(open_events, cut, partial(record.finish, "finished"))
    open_events = watched(open_events, progress)
    return await answer(request, shaper, open_events, body.stream, True, record)


def stream_cut(body: CompletionBody, infill: bool) -> StreamCut | None:
    """The stop rules the gateway applies to this request's text (gateway/llama_server_stops.py),
    or None when none is on; ApiError 400 for stop_at_suffix on /completion (it has no suffix)."""
    if body.stop_at_suffix and not infill:
        raise ApiError(400, "stop_at_suffix is an /infill option (a /completion has no suffix)",
                       param="stop_at_suffix")
    suffix = None
    if infill and body.stop_at_suffix is not False:
        suffix = SuffixStop.around(body.input_prefix + (body.prompt or ""), body.input_suffix)
    if suffix is None and not body.n_indent and not body.t_max_predict_ms:
        return None
    return StreamCut(suffix, body.n_indent, body.t_max_predict_ms)


def _names(samplers: list[str] | str) -> list[str]:
    return [SAMPLER_LETTERS.get(c, c) for c in samplers] if isinstance(samplers, str) else samplers


async def prompt_form(state: GatewayState, parts: list[str | int]) -> dict[str, Any]:
    """The engine request's prompt of /completion: text as is, ids as is, a mix as ids (each
    text encoded without special tokens but the first, which gets BOS where the model adds one)."""
    if len(parts) == 1 and isinstance(parts[0], str):
        return {"prompt": parts[0]}
    ids: list[int] = []
    for i, p in enumerate(parts):
        ids += [p] if isinstance(p, int) else await state.engine().tokenize(p, add_special=i == 0)
    return {"prompt_ids": ids}


async def rendered(state: GatewayState, request: Request) -> str:
    """/apply-template: the prompt text a chat request's messages (and tools) render to."""
    f = facts(state)
    req = parse(await read_body(request, state.max_body_bytes), ChatRequest)
    plan = tool_plan(req, tool_syntax(state))
    messages = chat_messages(req)
    try:
        return await trio.to_thread.run_sync(f.render, messages, plan.functions if plan else None)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="messages") from None


def props_body(state: GatewayState) -> dict[str, Any]:
    """/props: the server's defaults, context, slots, model and template."""
    out: dict[str, Any] = {"total_slots": slot_count(state), "build_info": f"zinfer {version('zinfer')}",
                           "modalities": {"vision": False, "audio": False}, "is_sleeping": False}
    if not state.ready:
        return out
    f = facts(state)
    params = sampling_params(ChatRequest(messages=[]), state.max_model_len, state.sampling)
    tok = f.prompts.tokenizer
    return {
        **out,
        "default_generation_settings": {"n_ctx": state.max_model_len,
                                        "params": settings(params, -1, APPLIED_ORDER)},
        "model_alias": state.model_name, "model_path": f.path, "chat_template": f.chat_template or "",
        "bos_token": tok.bos_token or "", "eos_token": tok.eos_token or "", "infill": f.fim is not None,
    }


def slot_count(state: GatewayState) -> int:
    return int(state.extra.get("max_running", 1))


async def slots_body(state: GatewayState) -> list[dict[str, Any]]:
    """/slots: --max-running slots, the first `running` of them busy."""
    stats = await state.engine().stats()
    return [{"id": i, "n_ctx": state.max_model_len, "is_processing": i < stats.running, "speculative": False}
            for i in range(max(slot_count(state), stats.running))]
