"""llama-server's native request bodies (`POST /completion`, `/infill`), validated at the edge,
and their translation into SamplingParams through the OpenAI completion request's checks.

Unknown fields are ignored, as llama-server ignores them. Taken: prompt (text, token ids,
or a mix of both in one list), n_predict (-1: up to the context; max_tokens is its
alias), stream, n_probs, temperature, top_k, top_p, min_p, seed (-1: random), stop,
repeat_penalty, presence_penalty, frequency_penalty, ignore_eos, logit_bias (pairs or a
map; false bans a token), grammar / json_schema, samplers (see sampler_settings),
return_tokens, timings_per_token, n_indent and t_max_predict_ms (0: off), and zinfer's
stop_at_suffix (/infill only; see gateway/llama_server_stops.py); cache_prompt, n_keep,
id_slot and min_keep 0/1 are accepted (the engine caches every prompt's prefix by itself and
never shifts the context). Samplers zinfer does not have are refused unless set to their
"off" value: typical_p, dynatemp_range, mirostat, xtc_probability, dry_multiplier,
top_n_sigma, repeat_last_n (only -1, or without a repeat_penalty), post_sampling_probs,
lora, n_cmpl. response_fields picks a whole answer's fields as llama-server does.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from zinfer.gateway.openai_schema import ApiError, CompletionRequest
from zinfer.messages.client import MAX_PROMPT_IDS, MAX_TEXT, Text
from zinfer.messages.params import MAX_IDS, MAX_LOGPROBS, MAX_STOPS, TOKEN_ID_LIMIT

Real = Annotated[float, Meta(ge=-1e9, le=1e9)]
BiasList = Annotated[list[Any], Meta(max_length=MAX_IDS)]  # [[token id, bias or false], ...]
BiasMap = Annotated[dict[str, Any], Meta(max_length=MAX_IDS)]  # {"token id": bias}
MAX_INDENT = 4096  # n_indent: columns
MAX_PREDICT_MS = 86_400_000  # t_max_predict_ms: a day
SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature")
"""The samplers zinfer runs: penalties first, then temperature, top_k, top_p, min_p (actors/sampling.py)."""
NO_OP_SAMPLERS = {  # llama.cpp samplers zinfer lacks, listed harmlessly while their parameter is off
    "dry": "dry_multiplier", "typ_p": "typical_p", "typical_p": "typical_p", "xtc": "xtc_probability",
    "top_n_sigma": "top_n_sigma", "mirostat": "mirostat",
}
SAMPLER_LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "m": "min_p", "x": "xtc",
                   "t": "temperature", "s": "top_n_sigma", "i": "infill", "e": "penalties"}


class ExtraChunk(msgspec.Struct):
    """One input_extra file; other fields (llama.vim sends each chunk's `time`) are ignored, as
    llama-server ignores them."""

    text: Text
    filename: Annotated[str, Meta(max_length=1024)] = "tmp"


class CompletionBody(msgspec.Struct, kw_only=True):
    prompt: Any = None  # /completion: required; /infill: text added after the prefix
    n_predict: Annotated[int, Meta(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None
    max_tokens: Annotated[int, Meta(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None
    stream: bool = False
    cache_prompt: bool = True
    n_probs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] = 0
    samplers: Annotated[list[Annotated[str, Meta(max_length=32)]], Meta(max_length=16)] | str | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    seed: int | None = None
    stop: Annotated[list[Annotated[str, Meta(max_length=512)]], Meta(max_length=MAX_STOPS)] | None = None
    repeat_penalty: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    repeat_last_n: Annotated[int, Meta(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None
    ignore_eos: bool = False
    logit_bias: BiasList | BiasMap | None = None
    grammar: Any = None
    json_schema: Any = None
    n_keep: int = 0
    id_slot: int = -1
    min_keep: Annotated[int, Meta(ge=0, le=1)] = 0
    return_tokens: bool = False
    timings_per_token: bool = False
    n_indent: Annotated[int, Meta(ge=0, le=MAX_INDENT)] = 0  # gateway/llama_server_stops.py
    t_max_predict_ms: Annotated[int, Meta(ge=0, le=MAX_PREDICT_MS)] = 0
    stop_at_suffix: bool | None = None  # /infill: None is on
    # a whole answer's fields to keep ("a/b": b of a, under the key "a/b"); [] or none: all
    response_fields: Annotated[list[Annotated[str, Meta(max_length=256)]], Meta(max_length=64)] = []
    # llama.cpp samplers and options zinfer does not have: only their "off" values pass
    typical_p: Real | None = None
    typ_p: Real | None = None
    dynatemp_range: Real | None = None
    mirostat: int | None = None
    xtc_probability: Real | None = None
    dry_multiplier: Real | None = None
    top_n_sigma: Real | None = None
    post_sampling_probs: bool | None = None
    lora: list[Any] | None = None
    n_cmpl: int | None = None
    # /infill
    input_prefix: Text = ""
    input_suffix: Text = ""
    input_extra: Annotated[list[ExtraChunk], Meta(max_length=256)] = []


OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "typical_p": (None, 1.0), "typ_p": (None, 1.0), "dynatemp_range": (None, 0.0), "mirostat": (None, 0),
    "xtc_probability": (None, 0.0), "dry_multiplier": (None, 0.0),
    "post_sampling_probs": (None, False), "lora": (None, []),
    "n_cmpl": (None, 1),
}


def check_off(body: CompletionBody) -> None:
    """ApiError 400 naming the first sampler or option zinfer lacks that is set on."""
    for name, off in OFF_VALUES.items():
        if getattr(body, name) not in off:
            raise ApiError(400, f"{name} is not supported (only its off value {off[-1]!r})", param=name)
    if body.top_n_sigma is not None and body.top_n_sigma > 0:
        raise ApiError(400, "top_n_sigma is not supported (only -1, off)", param="top_n_sigma")
    penalized = body.repeat_penalty is not None and body.repeat_penalty != 1.0
    if penalized and body.repeat_last_n not in (None, -1):
        raise ApiError(400, "repeat_last_n: the repeat penalty counts the whole context here (-1)",
                       param="repeat_last_n")


def sampler_settings(body: CompletionBody) -> dict[str, Any]:
    """What `samplers` (names, or llama-server's letters "kpmt...") leaves on: a sampler left
    out is off (top_k 0, top_p 1, min_p 0, penalties 1 and 0, temperature 1: the raw
    distribution). zinfer applies temperature before top_p and min_p; an order that puts
    them before a temperature that changes them (not 0 or 1) is refused."""
    given = body.samplers
    if given is None:
        return {}
    names = [SAMPLER_LETTERS.get(c, c) for c in given] if isinstance(given, str) else list(given)
    for name in names:
        if name == "infill":
            raise ApiError(400, "the infill sampler is not supported: leave it out of samplers", param="samplers")
        if name not in SAMPLERS and name not in NO_OP_SAMPLERS:
            raise ApiError(400, f"unknown sampler {name!r}; known: {', '.join([*SAMPLERS, *NO_OP_SAMPLERS])}",
                           param="samplers")
        off_param = NO_OP_SAMPLERS.get(name)
        if off_param is not None and getattr(body, off_param) not in OFF_VALUES.get(off_param, (None, -1.0)):
            raise ApiError(400, f"sampler {name!r} is not supported", param="samplers")
    out: dict[str, Any] = {}
    if "top_k" not in names:
        out["top_k"] = 0
    if "top_p" not in names:
        out["top_p"] = 1.0
    if "min_p" not in names:
        out["min_p"] = 0.0
    if "temperature" not in names:
        out["temperature"] = 1.0
    if "penalties" not in names:
        out.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    temperature = body.temperature if "temperature" in names else 1.0
    if temperature not in (None, 0.0, 1.0) and "temperature" in names:
        later = [n for n in ("top_p", "min_p") if n in names and names.index(n) < names.index("temperature")]
        if later:
            raise ApiError(400, f"samplers: zinfer applies temperature before {' and '.join(later)}; "
                           "list temperature first (or use temperature 0 or 1)", param="samplers")
    return out


def logit_bias(given: list[Any] | dict[str, Any] | None) -> dict[str, float] | None:
    """llama-server's logit_bias ([[id, bias], ...] or {"id": bias}; false: never) as OpenAI's map."""
    if given is None:
        return None
    pairs = list(given.items()) if isinstance(given, dict) else given
    out: dict[str, float] = {}
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise ApiError(400, "logit_bias is [[token id, bias], ...] or {\"token id\": bias}", param="logit_bias")
        tid, bias = pair
        if isinstance(tid, str) and tid.isdigit():
            tid = int(tid)
        if not isinstance(tid, int) or isinstance(tid, bool):
            raise ApiError(400, "logit_bias keys are token ids (text keys are not supported)", param="logit_bias")
        if not isinstance(bias, (int, float)):  # bool is an int: false bans, true is 1
            raise ApiError(400, "a logit_bias value is a number or false", param="logit_bias")
        out[str(tid)] = -100.0 if bias is False else max(-100.0, min(100.0, float(bias)))
    return out


def completion_request(body: CompletionBody, prompt: Any) -> CompletionRequest:
    """The OpenAI completion request of body (its prompt as given), for sampling_params."""
    check_off(body)
    n_predict = body.n_predict if body.n_predict is not None else body.max_tokens
    fields: dict[str, Any] = dict(
        prompt=prompt, stream=body.stream, temperature=body.temperature, top_p=body.top_p,
        top_k=body.top_k, min_p=body.min_p, seed=None if body.seed in (None, -1) else body.seed,
        stop=body.stop, repetition_penalty=body.repeat_penalty, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty, ignore_eos=body.ignore_eos, logit_bias=logit_bias(body.logit_bias),
        logprobs=body.n_probs or None, max_tokens=None if n_predict in (None, -1) else n_predict,
        grammar=body.grammar, json_schema=body.json_schema,
    )
    if fields["top_p"] == 0.0:
        fields["top_p"] = 1.0  # llama-server reads top_p 0 as off
    if fields["max_tokens"] == 0:
        raise ApiError(400, "n_predict is -1 or at least 1", param="n_predict")
    fields.update(sampler_settings(body))
    try:
        return msgspec.convert(fields, CompletionRequest)
    except msgspec.ValidationError as exc:  # a value llama-server takes and OpenAI's checks do not (temperature > 2)
        param = str(exc).rsplit("$.", 1)[-1].rstrip("`") if "$." in str(exc) else None
        raise ApiError(400, f"invalid request: {exc}", param=param) from None


def prompt_parts(prompt: Any) -> list[str | int]:
    """/completion's one prompt as text and token id pieces; ApiError 400 for anything else
    (several prompts in one request are refused: send one request each)."""
    if isinstance(prompt, str):
        if len(prompt) > MAX_TEXT:
            raise ApiError(400, f"prompt is longer than {MAX_TEXT} characters", param="prompt")
        return [prompt]
    if isinstance(prompt, list) and prompt and len(prompt) <= MAX_PROMPT_IDS:
        if all(isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool)) for p in prompt):
            if all(0 <= p < TOKEN_ID_LIMIT for p in prompt if isinstance(p, int)):
                if sum(len(p) for p in prompt if isinstance(p, str)) <= MAX_TEXT:
                    return list(prompt)
            raise ApiError(400, f"prompt token ids are 0 to 2**31-1, texts at most {MAX_TEXT} characters",
                           param="prompt")
        if all(isinstance(p, (str, list)) for p in prompt):
            raise ApiError(400, "one prompt per request: several prompts are not supported", param="prompt")
    raise ApiError(400, "prompt is a string, or a list of token ids and strings", param="prompt")
