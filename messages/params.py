"""Per-request sampling parameters, shared by the sampler, scheduler, front door and gateways.

Encoded as a map (field names on the wire) because it is also part of the public
ZeroMQ and stdio protocols, where clients in other languages build it by hand.

Two layers of checks: the field types bound every integer to 64 bits as it is decoded
(so whatever a relay decodes it can encode again), and `validate()`, which every way in
calls (the front door actor for ZeroMQ and stdio, the HTTP and websocket gateways before
that), checks each field's type and range, so NaN, infinities and absurd sizes never
reach the scheduler or the sampler.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
from msgspec import Meta

TOKEN_ID_LIMIT = 2**31
"""Token ids from clients are 0 <= id < this (the engine then checks them against the vocabulary)."""
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
"""A seed is any 64-bit integer, signed or unsigned."""
MAX_IDS = 1024
"""At most this many logit_bias entries and stop_token_ids (OpenAI allows 300 logit_bias keys)."""
MAX_STOPS, MAX_STOP_CHARS = 16, 512
"""At most 16 stop strings of 1 to 512 characters each."""
MAX_LOGPROBS, MAX_N = 20, 16
MAX_CONSTRAINT_BYTES = 256 << 10
"""A constraint's spec (schema, regex, grammar or choice list) is at most 256 KiB of UTF-8."""
CONSTRAINT_KINDS = ("json_schema", "regex", "lark", "gbnf", "choice")
MAX_PREFIX_IDS = 1 << 18
"""A constraint's prefix_ids hold at most this many token ids (the engine also bounds them by its context)."""

Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


class Constraint(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A grammar the generated text must match (constrained decoding, by llguidance in the sampler).

    kind "json_schema": spec is a JSON schema as JSON text (`{"type": "object"}`: any JSON
    object); "regex": a regular expression the whole output matches; "lark": a grammar in
    llguidance's Lark dialect (which may embed JSON schemas with `%json {...}`); "gbnf": a
    grammar in llama.cpp's GBNF (the front door converts it to Lark); "choice": a JSON
    array of strings, the output is exactly one of them. validate() checks the kind and the
    size; whether the spec compiles is checked at the engine's front door before the request
    is queued (actors/grammar_checker.py: a refusal is Rejected "bad_constraint"), and by
    the sampler again.

    prefix_ids: token ids the output already begins with under this grammar (a stream
    continued on another engine sends the ids it had streamed, which also end its prompt):
    the grammar advances over them before the first token is sampled, so the output goes on
    from that state. Each id must be one the grammar allows there, else the request is
    refused ("bad_constraint"). Empty (the default): the grammar starts at its beginning.
    """

    kind: str
    spec: str
    prefix_ids: list[Int64] = []


class SamplingParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """How to turn logits into tokens, and when to stop.

    temperature 0 means greedy. top_k 0 and top_p 1.0 and min_p 0.0 disable those
    filters. Penalties follow OpenAI (presence, frequency: subtracted) and
    llama.cpp/vLLM (repetition: divides positive logits, multiplies negative ones),
    counted over the generated tokens (presence/frequency) and over prompt plus
    generated tokens (repetition). logprobs N asks for the top-N alternatives per token.
    speculative picks the drafts of speculative decoding (actors/speculation.py): it changes
    speed only, never the greedy tokens nor the distribution sampled tokens follow.
    """

    temperature: float = 1.0
    top_k: Int64 = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[Int64, float] = {}
    seed: int | None = None
    max_tokens: Int64 = 256
    stop: list[str] = []
    stop_token_ids: list[Int64] = []
    ignore_eos: bool = False
    logprobs: Int64 | None = None
    n: Int64 = 1
    constraint: Constraint | None = None
    # "ngram" (prompt lookup drafts), "draft" (the server's draft model) or "off"; None: the server's default
    speculative: str | None = None

    def __post_init__(self) -> None:
        """Refuse a seed no 64-bit integer holds: it could not be encoded. Runs on decode too,
        where Meta cannot say it (its bounds stop at int64), and the error names the field."""
        if type(self.seed) is int and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"invalid value for seed: {_short(self.seed)} (an integer from -2**63 to 2**64-1)")

    def validate(self) -> None:
        """Raise ValueError naming the first field of a wrong type or out of range."""
        checks = [
            ("temperature", _real(self.temperature, 0.0, 100.0), "a number from 0 to 100"),
            ("top_k", _int(self.top_k, 0, TOKEN_ID_LIMIT - 1), "an integer from 0 (off) to 2**31-1"),
            ("top_p", _real(self.top_p, 0.0, 1.0) and self.top_p > 0.0, "a number in (0, 1]"),
            ("min_p", _real(self.min_p, 0.0, 1.0), "a number from 0 to 1"),
            ("repetition_penalty", _real(self.repetition_penalty, 0.01, 100.0), "a number from 0.01 to 100"),
            ("presence_penalty", _real(self.presence_penalty, -2.0, 2.0), "a number from -2 to 2"),
            ("frequency_penalty", _real(self.frequency_penalty, -2.0, 2.0), "a number from -2 to 2"),
            ("logit_bias", _bias(self.logit_bias),
             f"at most {MAX_IDS} token ids (0 to 2**31-1) -> numbers from -100 to 100"),
            ("seed", self.seed is None or _int(self.seed, SEED_MIN, SEED_MAX), "an integer from -2**63 to 2**64-1"),
            ("max_tokens", _int(self.max_tokens, 1, TOKEN_ID_LIMIT - 1), "an integer from 1 to 2**31-1"),
            ("stop", _strings(self.stop), f"at most {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters"),
            ("stop_token_ids", _ids(self.stop_token_ids), f"at most {MAX_IDS} token ids from 0 to 2**31-1"),
            ("ignore_eos", type(self.ignore_eos) is bool, "true or false"),
            ("logprobs", self.logprobs is None or _int(self.logprobs, 0, MAX_LOGPROBS),
             f"an integer from 0 to {MAX_LOGPROBS}"),
            ("n", _int(self.n, 1, MAX_N), f"an integer from 1 to {MAX_N}"),
            ("speculative", self.speculative in (None, "off", "ngram", "draft"), '"off", "ngram" or "draft"'),
            ("constraint", self.constraint is None or _constraint(self.constraint),
             f"kind one of {', '.join(CONSTRAINT_KINDS)}, a spec of at most {MAX_CONSTRAINT_BYTES >> 10} KiB and "
             f"at most {MAX_PREFIX_IDS} prefix_ids from 0 to 2**31-1"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"invalid value for {name}: {_short(getattr(self, name))} ({rule})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _int(x: Any, lo: int, hi: int) -> bool:
    return type(x) is int and lo <= x <= hi


def _real(x: Any, lo: float, hi: float) -> bool:
    """A finite int or float within [lo, hi] (NaN fails every comparison)."""
    return type(x) in (int, float) and lo <= x <= hi and (type(x) is int or math.isfinite(x))


def _ids(ids: Any) -> bool:
    return type(ids) is list and len(ids) <= MAX_IDS and all(_int(t, 0, TOKEN_ID_LIMIT - 1) for t in ids)


def _bias(bias: Any) -> bool:
    return type(bias) is dict and _ids(list(bias)) and all(_real(v, -100.0, 100.0) for v in bias.values())


def _strings(stop: Any) -> bool:
    return (type(stop) is list and len(stop) <= MAX_STOPS
            and all(type(s) is str and 0 < len(s) <= MAX_STOP_CHARS for s in stop))


def _constraint(c: Any) -> bool:
    """A Constraint of a known kind whose spec is a str of at most MAX_CONSTRAINT_BYTES in UTF-8
    (its length in characters, checked first, bounds the encoding's cost)."""
    return (type(c) is Constraint and c.kind in CONSTRAINT_KINDS and type(c.spec) is str
            and len(c.spec) <= MAX_CONSTRAINT_BYTES
            and len(c.spec.encode("utf-8", "surrogatepass")) <= MAX_CONSTRAINT_BYTES
            and type(c.prefix_ids) is list and len(c.prefix_ids) <= MAX_PREFIX_IDS
            and all(_int(t, 0, TOKEN_ID_LIMIT - 1) for t in c.prefix_ids))


def _short(value: Any) -> str:
    """repr of a client's value, cut to 80 characters (a value can be megabytes)."""
    huge = isinstance(value, int) and abs(value) >= 10**60
    text = f"an integer of {value.bit_length()} bits" if huge else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
