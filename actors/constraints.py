"""Constrained decoding: a request's Constraint (messages/params.py) compiled by llguidance
into a matcher that bans, at every step, the tokens its grammar does not allow.

llguidance (a Rust core, the engine vLLM, SGLang and llama.cpp use) compiles JSON schemas,
regexes and Lark grammars, and computes each step's allowed tokens as a bitmask over the
vocabulary while holding no GIL, so a worker thread can compute the next masks while the
executors run the next forward (MaskPrefetch).

- compile_grammar(constraint): the llguidance grammar, or ValueError naming the problem,
  after actors/grammar_limits.py has measured the spec (no library sees an unmeasured
  grammar). The grammar worker (actors/grammar_worker.py) calls it, in a child process,
  before the front door admits the request; the sampler calls it again. A JSON
  schema's integers and numbers get at most NUMBER_DIGITS digits before the point
  (bounded_numbers), as llama.cpp's JSON grammar has: llguidance's are unbounded, and a
  model can write "123456789012345..." until max_tokens.
- grammar_vocab.grammar_tokenizer(source): the model's vocabulary as llguidance's
  LLTokenizer, with the EOS ids the scheduler stops on. Takes seconds (BENCHMARKS.md,
  "actors/grammar_vocab.py"): built once per sampler actor, on the first constrained request.
- GrammarProbe: the worker's check of a constraint with the vocabulary: it compiles, and
  its first mask allows a token (an empty language, `start: start`, fails here).
- GrammarMask: one request's matcher and its next-token bitmask.
- on_thread(stack, fn): fn on a new thread with that much stack. llguidance recurses on
  the native stack; the sampler compiles on COMPILE_STACK, the worker probes on a
  quarter of it, so what the worker survived the engine survives.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np
import trio
from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from llguidance.gbnf_to_lark import gbnf_to_lark
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from zinfer.actors.grammar_limits import check_limits, parse_json
from zinfer.actors.grammar_vocab import grammar_tokenizer
from zinfer.messages.json_schema import JSON_OPTIONS, map_schemas
from zinfer.messages.params import Constraint
from zinfer.models.loader import open_model

NUMBER_DIGITS = 15
NUMBER_LIMIT = 10**NUMBER_DIGITS - 1
"""The bound bounded_numbers gives an integer or number schema on a side it leaves open: 15
digits, as many as an IEEE double holds exactly (what JSON parsers read numbers into,
RFC 8259 section 6); llama.cpp's JSON grammar allows 16. All nines, so llguidance's range
lexer stays small (other bounds cost more to compile: BENCHMARKS.md, "actors/constraints.py")."""

T = TypeVar("T")
KIND_NAMES = {
    "json_schema": "JSON schema",
    "regex": "regex",
    "lark": "Lark grammar",
    "gbnf": "GBNF grammar",
    "choice": "choice",
}
COMPILE_STACK = 16 << 20
"""Bytes of stack the engine compiles grammars on (the grammar worker probes on a quarter)."""


def limits() -> LLParserLimits:
    """llguidance's resource limits, its defaults but for errors that name no parser internals."""
    return LLParserLimits(verbose_errors=False)


def as_lark(constraint: Constraint) -> Constraint:
    """constraint with a GBNF grammar converted to Lark (measured first: the conversion is
    quadratic in its rules); others as they are. ValueError when GBNF does not parse."""
    if constraint.kind != "gbnf":
        return constraint
    check_limits(constraint)
    try:
        return Constraint("lark", gbnf_to_lark(constraint.spec), constraint.prefix_ids)
    except RecursionError:
        raise ValueError("invalid GBNF grammar: it nests too deeply") from None
    except Exception as exc:  # the converter raises its own error types
        raise ValueError(f"invalid GBNF grammar: {_first_line(str(exc))}") from None


def compile_grammar(constraint: Constraint) -> str:
    """The llguidance grammar of constraint; ValueError saying what is wrong with its spec."""
    constraint = as_lark(constraint)
    check_limits(constraint)
    kind, spec = constraint.kind, constraint.spec
    if kind == "json_schema":
        schema = parse_json(spec, "the JSON schema")
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"a JSON schema is an object (or true/false), got {type(schema).__name__}")
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(bounded_numbers(schema)), defaults=JSON_OPTIONS)
    elif kind == "regex":
        grammar = LLMatcher.grammar_from_regex(spec)
    elif kind == "lark":
        grammar = LLMatcher.grammar_from_lark(spec)
    elif kind == "choice":
        choices = parse_json(spec, "the choices")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("choices are a non-empty list of non-empty strings")
        grammar = LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    else:
        raise ValueError(f"unknown constraint kind {kind!r}")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, limits=limits())
    if is_error:
        raise ValueError(f"invalid {KIND_NAMES[kind]}: {_first_line(messages[0])}")
    return grammar


def bounded_numbers(schema: Any) -> Any:
    """schema with minimum -NUMBER_LIMIT / maximum NUMBER_LIMIT on every integer or number
    schema that leaves that side open (a copy): at most NUMBER_DIGITS digits before the
    point. A bound the schema gives is kept; one beyond the limit leaves the other side open."""
    return map_schemas(schema, _bound_numbers)


def _bound_numbers(schema: dict[str, Any]) -> dict[str, Any]:
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not any(t in ("integer", "number") for t in types):
        return schema
    lo = _number(schema, "minimum", "exclusiveMinimum")
    hi = _number(schema, "maximum", "exclusiveMaximum")
    if not ({"minimum", "exclusiveMinimum"} & schema.keys()) and (hi is None or hi >= -NUMBER_LIMIT):
        schema["minimum"] = -NUMBER_LIMIT
    if not ({"maximum", "exclusiveMaximum"} & schema.keys()) and (lo is None or lo <= NUMBER_LIMIT):
        schema["maximum"] = NUMBER_LIMIT
    return schema


def _number(schema: Mapping[str, Any], *keys: str) -> float | None:
    """The first of keys' values that is a number (draft 4's boolean exclusive* is not)."""
    for key in keys:
        value = schema.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _first_line(message: str) -> str:
    """llguidance's message on one line, without its source excerpt and caret lines (the
    excerpt can repeat a 256 KiB spec), at most 500 characters."""
    lines = [ln.strip() for ln in message.splitlines() if not re.match(r"\s*\d+ \|", ln)]
    keep = [ln for ln in lines if ln and ln not in ("^", "<non-verbose/>")]
    text = " ".join(keep) or "rejected by llguidance"
    return text if len(text) <= 500 else text[:497] + "..."


class ConstraintError(ValueError):
    """A grammar cannot be followed: it does not compile, allows nothing next, or hit a limit."""


class GrammarMask:
    """One request's grammar state: an llguidance matcher and the bitmask of the tokens
    allowed next. masked() bans the others in a logits row; accept() advances the matcher.
    Once the grammar is complete (the matcher stopped) only EOS is allowed. Build it on a
    COMPILE_STACK thread (on_thread): its grammar is compiled as it is made, then advanced
    over the constraint's prefix_ids (ConstraintError naming the first id it does not allow)."""

    def __init__(self, tokenizer: LLTokenizer, constraint: Constraint, vocab_size: int):
        self.accepted = 0  # tokens the matcher has consumed
        self.matcher = LLMatcher(tokenizer, compile_grammar(constraint), log_level=0, limits=limits())
        self._check()
        self.vocab_size = vocab_size
        self.bitmask = allocate_token_bitmask(1, vocab_size)  # [1, ceil(vocab / 32)] int32; bit t: token t allowed
        self.fresh = False  # whether bitmask is the mask of the matcher's current state
        self._advance(constraint.prefix_ids)

    def _advance(self, prefix_ids: Sequence[int]) -> None:
        """Consume the tokens the output already begins with (a continued stream's)."""
        for i, t in enumerate(prefix_ids):
            if not 0 <= t < self.vocab_size:
                raise ConstraintError(f"prefix_ids[{i}]: token {t} is not in the vocabulary of {self.vocab_size}")
            if self.matcher.is_stopped() and not self.matcher.is_error():
                raise ConstraintError(f"prefix_ids[{i}]: the grammar is complete before token {t}")
            if not self.matcher.consume_token(t):
                raise ConstraintError(f"prefix_ids[{i}]: the grammar does not allow token {t} there")
            self.accepted += 1

    def fill(self) -> None:
        """Compute the next token's mask unless it is fresh. Holds no GIL while llguidance
        works, so it may run in a worker thread (never two at once on one GrammarMask)."""
        if not self.fresh:
            fill_next_token_bitmask(self.matcher, self.bitmask)
            self.fresh = True

    def masked(self, z: np.ndarray) -> np.ndarray:
        """A copy of logits z [vocab] with every token the grammar bans at -inf."""
        self.fill()
        self._check()
        bits = self.bitmask.view(np.uint8)  # [1, ceil(vocab / 32) * 4]
        allowed = np.unpackbits(bits, count=self.vocab_size, bitorder="little").view(bool)  # [vocab]
        return np.where(allowed, z, np.float32(-np.inf)).astype(np.float32, copy=False)

    def accept(self, token_id: int) -> None:
        """Advance the matcher past token_id; ValueError if the grammar does not allow it."""
        if self.matcher.is_stopped() and not self.matcher.is_error():
            return  # complete: only EOS was allowed (it ends the sequence unless ignore_eos)
        if not self.matcher.consume_token(token_id):
            self._check()
            raise ConstraintError(f"token {token_id} is not allowed here")
        self.fresh = False
        self.accepted += 1

    def _check(self) -> None:
        if self.matcher.is_error():
            error = self.matcher.get_error()
            if error.startswith("NoExtensionBias"):  # no token continues the output
                n = self.accepted
                where = "no output at all" if n == 0 else f"nothing after the {n} tokens generated"
                raise ConstraintError(f"the grammar allows {where} (a rule that can never complete?)")
            if self.accepted == 0:
                raise ConstraintError(_first_line(error))
            raise ConstraintError(
                f"the grammar cannot be followed after the {self.accepted} tokens generated: {_first_line(error)}")


class GrammarProbe:
    """The grammar worker's check of constraints against one vocabulary."""

    def __init__(self, tokenizer: LLTokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size

    @staticmethod
    def for_model(model: str) -> GrammarProbe:
        """The probe of a model (a path or known name): builds its llguidance vocabulary."""
        source = open_model(model)
        return GrammarProbe(grammar_tokenizer(source), source.spec.vocab_size)

    def check(self, constraint: Constraint) -> Constraint:
        """The constraint the engine should run (GBNF as Lark) once it compiles with the
        vocabulary and its first mask allows a token; ValueError saying why not."""
        constraint = as_lark(constraint)
        mask = GrammarMask(self.tokenizer, constraint, self.vocab_size)
        mask.masked(np.zeros(self.vocab_size, np.float32))  # raises when nothing is allowed
        return constraint


def on_thread(stack: int, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a new thread with `stack` bytes of stack; returns or raises what it did.
    Blocks: call it from a worker thread, not the event loop."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append((True, fn(*args)))
        except BaseException as exc:  # re-raised in the caller
            result.append((False, exc))

    with _stack_lock:  # threading.stack_size is process-wide: set it only for this start
        old = threading.stack_size(stack)
        try:
            thread = threading.Thread(target=run, name="grammar-compile", daemon=True)
            thread.start()
        finally:
            threading.stack_size(old)
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


_stack_lock = threading.Lock()


def fill_masks(masks: Sequence[GrammarMask]) -> None:
    """Compute every stale mask (in a worker thread); a mask that fails stays stale, so the
    request's own sampling computes it again and fails alone."""
    for m in masks:
        try:
            m.fill()
        except Exception:
            pass


class MaskPrefetch:
    """Next-token masks computed in a worker thread between rounds: start() right after a
    round is sampled (the executors now run the next forward), wait() when the next round's
    logits arrive, before any GrammarMask is touched again."""

    def __init__(self) -> None:
        self._done: trio.Event | None = None

    def start(self, nursery: trio.Nursery, masks: Sequence[GrammarMask]) -> None:
        stale = [m for m in masks if not m.fresh]
        if not stale:
            return
        done = self._done = trio.Event()

        async def work() -> None:
            try:
                await trio.to_thread.run_sync(fill_masks, stale)
            finally:
                done.set()

        nursery.start_soon(work)

    async def wait(self) -> None:
        if self._done is not None:
            await self._done.wait()
            self._done = None

