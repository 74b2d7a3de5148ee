"""Ollama's API: /api/chat and /api/generate (NDJSON streams by default, or one object with
"stream": false), /api/tags, /api/show, /api/ps and /api/version, with Ollama's error
shape ({"error": "..."}).

Generations run as the chat or completion request they translate to
(gateway/ollama_schema.py) through the OpenAI routes' machinery: the same metrics record,
engine events, refusal before the 200, cancellation when the client leaves. /api/generate
with a `suffix` is a fill-in-the-middle prompt from the model's FIM tokens
(gateway/infill_prompt.py), as llama-server's /infill builds it. A request with no
messages (or an empty prompt) only asks that the model be loaded: it is, so the answer is
done_reason "load" at once. The model is named as the OpenAI routes name it, with or
without Ollama's ":latest" tag.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import datetime, timezone
from functools import partial
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zinfer.gateway.error_shapes import OllamaError, reshaped
from zinfer.gateway.infill_prompt import facts, infill_ids
from zinfer.gateway.metrics import RequestRecord
from zinfer.gateway.model_facts import ModelFacts
from zinfer.gateway.openai_api import (
    answer,
    chat_form,
    constrained,
    engine_events,
    generate,
    read_body,
    tool_syntax,
)
from zinfer.gateway.openai_schema import ApiError, ChatRequest, parse, sampling_params
from zinfer.gateway.openai_tools import tool_plan
from zinfer.gateway.ollama_schema import (
    OllamaChatRequest,
    OllamaGenerateRequest,
    ShowRequest,
    chat_request,
    format_constraint,
    generate_request,
)
from zinfer.gateway.ollama_shaper import OllamaShaper, created_at
from zinfer.gateway.protocol_events import NDJSONLiveStream, Progress, watched
from zinfer.gateway.state import GatewayState

API_VERSION = "0.9.0"
"""The Ollama API version these routes follow (clients compare it to feature versions)."""
FAR_FUTURE = "2262-04-11T23:47:16Z"  # the model is never unloaded: Ollama's keep_alive -1 expiry


def routes(state: GatewayState) -> list[Route]:
    async def chat(request: Request) -> Response:
        return await generate(state, request, OllamaChatRequest, respond)

    async def generate_(request: Request) -> Response:
        return await generate(state, request, OllamaGenerateRequest, respond)

    async def tags(request: Request) -> Response:
        return JSONResponse({"models": [model_entry(state, facts_or_error(state))]})

    async def ps(request: Request) -> Response:
        entry = {**model_entry(state, facts_or_error(state)), "expires_at": FAR_FUTURE, "size_vram": 0,
                 "context_length": state.max_model_len}
        return JSONResponse({"models": [entry]})

    async def show(request: Request) -> Response:
        try:
            return JSONResponse(await show_body(state, request))
        except ApiError as exc:
            return reshaped(exc, OllamaError).response()

    async def version(request: Request) -> Response:
        return JSONResponse({"version": API_VERSION})

    return [
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/generate", generate_, methods=["POST"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/version", version, methods=["GET"]),
    ]


def serves(state: GatewayState, name: str | None) -> bool:
    """Whether an Ollama model name (":latest" optional) is the served model."""
    return name is not None and (state.serves(name) or (name.endswith(":latest") and state.serves(name[:-7])))


def not_found(name: str | None) -> ApiError:
    return OllamaError(404, f"model {name!r} not found: this server serves its own model only", param="model")


def facts_or_error(state: GatewayState) -> ModelFacts | None:
    try:
        return facts(state)
    except ApiError:
        return None


async def read_ollama(state: GatewayState, request: Request, kind: type[Any]) -> Any:
    state.engine()  # 503 while the model loads
    req = parse(await read_body(request, state.max_body_bytes), kind)
    model = getattr(req, "model", None) or getattr(req, "name", None)
    if model and not serves(state, model):
        raise not_found(model)
    return req


async def respond(
    state: GatewayState, request: Request, kind: type[OllamaChatRequest | OllamaGenerateRequest],
    record: RequestRecord,
) -> Response:
    """Validate, then answer whole, or hand back an NDJSON LiveStream to send."""
    try:
        req = await read_ollama(state, request, kind)
        chat_api = isinstance(req, OllamaChatRequest)
        translated = chat_request(req, state.max_model_len) if chat_api else generate_request(req, state.max_model_len)
        if (not req.messages) if chat_api else not (req.prompt or req.suffix):
            record.finish("finished")
            return JSONResponse(loaded(req.model, chat_api))
        plan = tool_plan(translated, tool_syntax(state)) if isinstance(translated, ChatRequest) else None
        params = sampling_params(translated, state.max_model_len, state.sampling)
        if not isinstance(translated, ChatRequest) and translated.max_tokens is None:
            params = msgspec.structs.replace(params, max_tokens=state.max_model_len)  # num_predict -1: as chat
        params = constrained(params, format_constraint(req.format), plan)
        forms = [await form(state, req, translated, plan)]
    except ApiError as exc:
        record.finish("rejected")
        return reshaped(exc, OllamaError).response()
    rid, progress = uuid.uuid4().hex, Progress()
    constraint_param = "tools" if plan is not None and plan.forced else "format"
    shaper = OllamaShaper(req.model, chat_api, plan.names if plan else None, progress, constraint_param)
    open_events = watched(partial(engine_events, state.engine(), forms, params, rid, record), progress)
    return await answer(request, shaper, open_events, req.stream, True, record, NDJSONLiveStream)


async def form(state: GatewayState, req: Any, translated: Any, plan: Any) -> dict[str, Any]:
    """The engine request's prompt: chat messages, raw text, or an infill's ids."""
    if isinstance(translated, ChatRequest):
        return chat_form(translated, plan)
    if req.suffix is not None:
        return {"prompt_ids": await infill_ids(state, req.prompt, req.suffix, param="suffix")}
    return {"prompt": req.prompt}


def loaded(model: str, chat: bool) -> dict[str, Any]:
    """The answer to a request that only asks for the model to be loaded."""
    body: dict[str, Any] = {"model": model, "created_at": created_at()}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return {**body, "done": True, "done_reason": "load"}


def details(f: ModelFacts) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf" if f.path.endswith(".gguf") else "safetensors", "family": f.arch,
            "families": [f.arch], "parameter_size": f.parameter_size, "quantization_level": f.quant}


def digest(f: ModelFacts) -> str:
    """Names the file (its path, size and modification time), not a hash of its bytes."""
    mtime = os.stat(f.path).st_mtime_ns
    return hashlib.sha256(f"{f.path}\n{f.size_bytes}\n{mtime}".encode()).hexdigest()


def model_entry(state: GatewayState, f: ModelFacts | None) -> dict[str, Any]:
    """The served model as /api/tags and /api/ps list it (no facts yet: its name only)."""
    entry: dict[str, Any] = {"name": state.model_name, "model": state.model_name}
    if f is not None:
        modified = created_at() if not os.path.exists(f.path) else _iso(os.stat(f.path).st_mtime)
        entry.update(modified_at=modified, size=f.size_bytes, digest=digest(f), details=details(f))
    return entry


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


async def show_body(state: GatewayState, request: Request) -> dict[str, Any]:
    """/api/show: the template, details, model_info and capabilities of the served model."""
    req = await read_ollama(state, request, ShowRequest)
    if not (req.model or req.name):
        raise ApiError(400, "model is required", param="model")
    f = facts(state)
    capabilities = ["completion", "tools"] + (["insert"] if f.fim is not None else [])
    info = {"general.architecture": f.arch, "general.name": f.name, "general.parameter_count": f.n_params,
            f"{f.arch}.context_length": f.context_length}
    return {"license": "", "modelfile": "", "parameters": "", "template": f.chat_template or "",
            "details": details(f), "model_info": info, "capabilities": capabilities,
            "modified_at": model_entry(state, f).get("modified_at")}
