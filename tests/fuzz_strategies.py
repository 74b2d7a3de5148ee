"""Hypothesis strategies for the fuzz suite: well-formed requests carrying hostile values, and garbage.

Every strategy draws plain Python objects (dicts, lists, str, int, float, ...). Two
encoders turn them into bytes: `to_json` (Python's json, which writes NaN, Infinity and
ints of any size) for HTTP, the websocket and stdio, and `to_msgpack` for ZeroMQ (where
ints must fit 64 bits and strings must be valid UTF-8, so its strategies are drawn with
`wire="msgpack"`). A `Deep(n)` anywhere in an object becomes n levels of nesting in
the encoded bytes, deeper than either library would build from a Python object.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import msgspec
from hypothesis import strategies as st

HUGE_INTS = [2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, -(2**63) - 1, 10**30, -(10**30), 10**400]
ODD_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, -1e308]
ODD_STRINGS = ["", " ", "\x00", "\u202e", "\ufeff", "🙂" * 40, "<|bos|>", "<|eos|>", "a" * 5000, "hi " * 2000,
               "é" * 300]
TOKEN = st.integers(0, 297)  # an id in the tiny model's vocabulary (and in any real one)
STOP = st.text(min_size=1, max_size=6)  # a well-formed stop string (hostile ones come from `mutated`)
IDS = ["a", "b", "c"]
# 1-4 tokens mostly; sometimes a long run (with ignore_eos drawn too) that a cancel or a leaving
# client can catch mid-stream
MAX_TOKENS = st.sampled_from([1, 2, 3, 4, 1, 2, 3, 4, 200])  # few, so requests of one case collide on ids
ROLES = ["user", "user", "assistant", "system", "tool", "", "x" * 200]


@dataclass(frozen=True)
class Deep:
    """A value nested `depth` levels deep, as a list ("[[[...]]]") or an object ({"a": {"a": ...}})."""

    depth: int
    kind: str = "list"

    def json(self) -> bytes:
        if self.kind == "list":
            return b"[" * self.depth + b"]" * self.depth
        return b'{"a":' * self.depth + b"1" + b"}" * self.depth

    def msgpack(self) -> bytes:
        if self.kind == "list":
            return b"\x91" * self.depth + b"\xc0"  # fixarray of one element, ..., nil
        return b"\x81\xa1a" * self.depth + b"\x01"  # fixmap {"a": ...}, ..., 1


def _placeholders(obj: Any, found: list[Deep]) -> Any:
    """obj with each Deep replaced by a unique placeholder string, recorded in `found`."""
    if isinstance(obj, Deep):
        found.append(obj)
        return f"@@deep{len(found) - 1}@@"
    if isinstance(obj, dict):
        return {k: _placeholders(v, found) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_placeholders(v, found) for v in obj]
    return obj


def to_json(obj: Any) -> bytes:
    """obj as JSON text bytes the way Python writes it (NaN, Infinity, big ints), Deep expanded."""
    found: list[Deep] = []
    out = json.dumps(_placeholders(obj, found)).encode()
    for i, deep in enumerate(found):
        out = out.replace(f'"@@deep{i}@@"'.encode(), deep.json())
    return out


def to_msgpack(obj: Any) -> bytes:
    """obj as one msgpack frame, Deep expanded."""
    found: list[Deep] = []
    out = msgspec.msgpack.encode(_placeholders(obj, found))
    for i, deep in enumerate(found):
        out = out.replace(msgspec.msgpack.encode(f"@@deep{i}@@"), deep.msgpack())
    return out


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, drawn with the given integer weights (st.one_of weighs branches alike)."""
    return st.sampled_from([s for weight, s in choices for _ in range(weight)]).flatmap(lambda s: s)


# ---- hostile scalars and values -------------------------------------------------------


def ints(wire: str = "json") -> st.SearchStrategy[int]:
    """Small, 64-bit and (for JSON) far larger ints, negatives included."""
    base = [st.integers(-3, 300), st.integers(-(2**63), 2**64 - 1)]
    if wire == "json":
        base += [st.sampled_from(HUGE_INTS), st.integers()]
    else:
        base.append(st.sampled_from([v for v in HUGE_INTS if -(2**63) <= v < 2**64]))
    return st.one_of(*base)


def floats() -> st.SearchStrategy[float]:
    return st.one_of(st.floats(), st.sampled_from(ODD_FLOATS))


def strings(wire: str = "json") -> st.SearchStrategy[str]:
    odd = ODD_STRINGS + (["\ud800", "a\udfffb"] if wire == "json" else [])  # lone surrogates: JSON escapes only
    return st.one_of(st.text(max_size=20), st.sampled_from(odd))


def hostile(wire: str = "json") -> st.SearchStrategy[Any]:
    """Any one value of a wrong type or a hostile size: a field's replacement."""
    scalars = st.one_of(ints(wire), floats(), strings(wire), st.booleans(), st.none())
    deep = st.builds(Deep, st.sampled_from([64, 1000, 100_000]), st.sampled_from(["list", "dict"]))
    small = st.recursive(scalars,
                         lambda inner: (st.lists(inner, max_size=3)
                                        | st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                         max_leaves=6)
    return st.one_of(scalars, small, deep, st.just([]), st.just({}))


@st.composite
def mutated(draw, base: st.SearchStrategy, wire: str = "json"):
    """A draw of `base` with 0-2 values somewhere inside it (top level or nested) made hostile."""
    obj = draw(base)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):  # half the draws stay well-formed
        obj = _replace_one(draw, obj, wire)
    return obj


def extreme_like(value: Any, wire: str = "json") -> st.SearchStrategy[Any]:
    """A value of the same type as `value` at a hostile extreme: huge ints, NaN, long or odd strings, empty or deep."""
    if isinstance(value, bool) or value is None:
        return hostile(wire)
    if isinstance(value, int):
        return ints(wire)
    if isinstance(value, float):
        return floats()
    if isinstance(value, str):
        return strings(wire)
    if not isinstance(value, (list, dict)):
        return hostile(wire)
    return st.one_of(st.just(type(value)()),
                     st.builds(Deep, st.sampled_from([64, 1000, 100_000]),
                               st.just("list" if isinstance(value, list) else "dict")))


def _hostile_for(draw, value: Any, wire: str) -> Any:
    return draw(st.one_of(extreme_like(value, wire), hostile(wire)))


def _replace_one(draw, obj: Any, wire: str) -> Any:
    """obj with one value, at a path drawn by walking into dicts and lists, replaced by a hostile one."""
    # unknown types: drawn as such
    keys = sorted((k for k in obj if k != "type"), key=repr) if isinstance(obj, dict) else []
    if keys:
        key = draw(st.sampled_from(keys))
        return {**obj, key: _replace_one(draw, obj[key], wire) if draw(st.booleans())
                else _hostile_for(draw, obj[key], wire)}
    if isinstance(obj, list) and obj:
        i = draw(st.integers(0, len(obj) - 1))
        return [*obj[:i],
                _replace_one(draw, obj[i], wire) if draw(st.booleans()) else _hostile_for(draw, obj[i], wire),
                *obj[i + 1 :]]
    return _hostile_for(draw, obj, wire)


def unknown_fields(wire: str = "json") -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(["foo", "extra", "Type", "tools", "id "]), hostile(wire), max_size=2)


def _with_extra(base: st.SearchStrategy[dict], wire: str = "json") -> st.SearchStrategy[dict]:
    """base, sometimes with unknown fields added, then mutated."""
    return mutated(st.builds(lambda b, extra: {**extra, **b}, base,
                             weighted((4, st.just({})), (1, unknown_fields(wire)))), wire)


# ---- the OpenAI HTTP bodies -----------------------------------------------------------


def chat_messages(wire: str = "json") -> st.SearchStrategy:
    message = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": strings(wire)})
    parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": strings(wire)}),
                     max_size=2)
    message = message | st.fixed_dictionaries({"role": st.just("user"), "content": parts})
    return st.lists(message, min_size=1, max_size=3)


def _openai_sampling(wire: str = "json") -> dict[str, st.SearchStrategy]:
    """Optional fields both OpenAI endpoints take, well-formed."""
    token = TOKEN
    return {
        "model": st.sampled_from(["x", ""]),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "n": st.integers(1, 3),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "stop": st.one_of(STOP, st.lists(STOP, max_size=3)),
        "seed": st.integers(0, 2**32),
        "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2),
        "logit_bias": st.dictionaries(token.map(str), st.floats(-100, 100), max_size=3),
        "top_k": st.integers(-1, 50),
        "min_p": st.floats(0, 1),
        "repetition_penalty": st.floats(0.5, 2),
        "ignore_eos": st.booleans(),
    }


def chat_body() -> st.SearchStrategy[dict]:
    optional = {**_openai_sampling(), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5),
                "max_completion_tokens": st.integers(1, 4)}
    base = st.fixed_dictionaries({"messages": chat_messages(), "max_tokens": MAX_TOKENS}, optional=optional)
    return _with_extra(base)


def completion_body() -> st.SearchStrategy[dict]:
    prompt = st.one_of(strings(), st.lists(ints(), max_size=5), st.lists(strings(), min_size=1, max_size=2),
                       st.lists(st.lists(TOKEN, max_size=3), max_size=2))
    optional = {**_openai_sampling(), "logprobs": st.integers(0, 5), "echo": st.booleans()}
    return _with_extra(st.fixed_dictionaries({"prompt": prompt, "max_tokens": MAX_TOKENS}, optional=optional))


def tokenize_body() -> st.SearchStrategy[dict]:
    return _with_extra(st.fixed_dictionaries({"content": strings()}, optional={"add_special": st.booleans()}))


def detokenize_body() -> st.SearchStrategy[dict]:
    return _with_extra(st.fixed_dictionaries({"tokens": st.lists(TOKEN, max_size=6)}))


GARBAGE_TEXT = [b"", b"{", b"[", b"null", b"1", b'"x"', b"{}", b"[]", b'{"a":', b"\xff\xfe", b"\x00" * 10,
                b"NaN", b'{"messages": NaN}']


def garbage_bytes() -> st.SearchStrategy[bytes]:
    """Raw bytes that are not a request: random, truncated JSON, invalid UTF-8."""
    return st.one_of(st.binary(max_size=64), st.sampled_from(GARBAGE_TEXT))


def http_body(route: str) -> st.SearchStrategy[bytes]:
    """A request body for a POST route: a hostile-valued JSON object, or garbage bytes."""
    body = {"/v1/chat/completions": chat_body, "/v1/completions": completion_body,
            "/tokenize": tokenize_body, "/detokenize": detokenize_body}[route]()
    return weighted((3, body.map(to_json)), (1, garbage_bytes()))


# ---- the engine's client protocol (ZeroMQ maps, stdio lines) --------------------------


def sampling_params(wire: str) -> st.SearchStrategy:
    """The `params` map of messages/params.py: every field optional, well-formed."""
    token = TOKEN
    optional = {
        "temperature": st.floats(0, 2),
        "top_k": st.integers(0, 50),
        "top_p": st.floats(0.01, 1),
        "min_p": st.floats(0, 1),
        "repetition_penalty": st.floats(0.5, 2),
        "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2),
        "logit_bias": st.dictionaries(token, st.floats(-100, 100), max_size=3),
        "seed": st.integers(0, 2**32),
        "stop": st.lists(STOP, max_size=3),
        "stop_token_ids": st.lists(token, max_size=3),
        "ignore_eos": st.booleans(),
        "logprobs": st.integers(0, 5),
        "n": st.integers(1, 3),
    }
    return st.fixed_dictionaries({"max_tokens": MAX_TOKENS}, optional=optional)


def request_id(wire: str) -> st.SearchStrategy:
    return st.sampled_from([*IDS, ""])


def engine_request(wire: str) -> st.SearchStrategy[dict]:
    """One client request map: generate, cancel, tokenize, detokenize, stats or an unknown type."""
    rid = request_id(wire)
    prompt_keys = {"prompt": strings(wire), "messages": chat_messages(wire),
                   "prompt_ids": st.lists(TOKEN, min_size=1, max_size=5)}
    prompts = st.one_of(*[st.fixed_dictionaries({k: v}) for k, v in prompt_keys.items()],
                        st.fixed_dictionaries({}, optional=prompt_keys))
    generate = st.builds(
        lambda p, rest: {**rest, **p},
        prompts,
        st.fixed_dictionaries(
            {"type": st.just("generate"), "request_id": rid, "params": sampling_params(wire)},
            optional={"add_special": st.booleans(), "traceparent": strings(wire)},
        ),
    )
    cancel = st.fixed_dictionaries({"type": st.just("cancel"), "request_id": rid})
    text = st.one_of(st.fixed_dictionaries({"text": strings(wire)}),
                     st.fixed_dictionaries({"messages": chat_messages(wire)}),
                     st.fixed_dictionaries({}, optional={"text": strings(wire), "messages": chat_messages(wire)}))
    tokenize = st.builds(lambda t, rest: {**rest, **t}, text,
                         st.fixed_dictionaries({"type": st.just("tokenize"), "request_id": rid},
                                               optional={"add_special": st.booleans()}))
    detokenize = st.fixed_dictionaries({"type": st.just("detokenize"), "request_id": rid,
                                        "token_ids": st.lists(TOKEN, max_size=5)})
    stats = st.fixed_dictionaries({"type": st.just("stats"), "request_id": rid})
    other = st.fixed_dictionaries({"type": st.sampled_from(["explode", "Generate", ""]), "request_id": rid})
    kinds = weighted((4, generate), (1, cancel), (1, tokenize), (1, detokenize), (1, stats), (1, other))
    return _with_extra(kinds, wire)


def engine_requests(wire: str) -> st.SearchStrategy[list]:
    """One fuzz case: a burst of 1-5 requests (dicts) or garbage frames (bytes), ids colliding."""
    one = weighted((4, engine_request(wire)), (1, garbage_bytes()))
    return st.lists(one, min_size=1, max_size=5)


# ---- the websocket protocol -----------------------------------------------------------


def ws_message() -> st.SearchStrategy:
    """One websocket client message (dict) or garbage text (str)."""
    wid = st.sampled_from([*IDS, ""])
    prompts = st.one_of(
        st.fixed_dictionaries({"prompt": strings()}),
        st.fixed_dictionaries({"messages": chat_messages()}),
        st.fixed_dictionaries({}, optional={"prompt": strings(), "messages": chat_messages()}),
    )
    generate = st.builds(
        lambda p, rest: {**rest, **p},
        prompts,
        st.fixed_dictionaries({"type": st.just("generate"), "id": wid, "params": sampling_params("json")},
                              optional={"add_special": st.booleans()}),
    )
    cancel = st.fixed_dictionaries({"type": st.just("cancel"), "id": wid})
    ping = st.just({"type": "ping"})
    other = st.fixed_dictionaries({"type": hostile()}, optional={"id": wid})
    garbage = garbage_bytes().map(lambda b: b.decode("utf-8", "replace"))
    message = _with_extra(weighted((4, generate), (1, cancel), (1, ping), (1, other)))
    return weighted((4, message), (1, garbage))


def ws_messages() -> st.SearchStrategy[list]:
    return st.lists(ws_message(), min_size=1, max_size=5)
