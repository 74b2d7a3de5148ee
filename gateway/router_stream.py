"""One routed generation's stream across replicas: what the client has seen, what a moved
request sends to the next replica, and how that replica's events read as one stream.

A pure state machine (no I/O): gateway/router.py sends `request()` to a replica, passes each
event it gets through `see()` and yields what comes out. Its contracts:

- The client sees one Started (the first replica's), then Deltas, then exactly one terminal
  event, whatever number of replicas served the request.
- `request()` before any token was streamed is the original Generate (the same request_id):
  nothing was shown, so the next replica starts it afresh.
- After tokens were streamed, a one-choice request (n == 1) is continued: `request()` is
  prompt_ids = the prompt's ids + every token id already sent, max_tokens less those tokens,
  add_special off, and a grammar constraint's prefix_ids extended by those tokens (the next
  replica's grammar starts from the state after them: messages/params.py). The
  continuation's text is recomputed here from its token ids with a detokenizer and a stop
  matcher that were fed the tokens already sent, so the text has no gap and no duplicate (a
  character or a stop-string prefix the lost replica held back comes out now), and a stop
  string that spans the move still ends the stream. Its usage counts the original prompt and
  every generated token; Finished carries the original prompt ids.
- After tokens were streamed, a request of n > 1 choices splits: `request()` is a `Split`,
  one one-choice child stream per choice that has not finished (its prompt, that choice's
  ids already sent as its own, seed + index as the engine seeds choice index, the remaining
  max_tokens); each child continues (or starts, if that choice had streamed nothing) on any
  replica and moves on its own. `merge()` reads the children's events as the one stream:
  their Deltas under their choice's index, then one Finished with every choice's finish
  reason once all have ended; the first child that ends otherwise ends the stream. Choices
  that had finished stay finished.
- A refusal after Started (the next replica would not take the rest) ends the stream as
  Failed. A stream that cannot continue (no tokenizer, no prompt ids) ends with one Failed
  event naming why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from zinfer.messages.params import SEED_MAX
from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Generate, Rejected, Started, Usage
from zinfer.models.detokenize import IncrementalDetokenizer, StopMatcher
from zinfer.models.tokenizer import Tokenizer

LOST = "replica_lost"
"""Failed.code of a stream whose replica was lost and that could not be continued elsewhere."""


@dataclass
class Split:
    """The children a request of several choices goes on as, by choice index."""

    children: dict[int, RoutedStream]


@dataclass
class RoutedStream:
    """The state of one routed Generate across the replicas that served it."""

    original: Generate
    tokenizer: Tokenizer | None = None  # to recompute a continuation's text; None: a move after tokens fails
    prompt_ids: list[int] | None = None  # the original prompt's ids, set by the router before a continuation
    started: Started | None = None
    ids: list[list[int]] = field(default_factory=list)  # by choice: every token id sent to the client
    reasons: list[str | None] = field(default_factory=list)  # by choice: its finish reason, once a Delta carried one
    moves: int = 0  # replicas lost under this request
    done: bool = False
    cancelled: bool = False  # the client cancelled it while no replica held it
    children: dict[int, RoutedStream] = field(default_factory=dict)  # by choice index, once split
    _continuing: bool = False  # the current replica serves a continuation
    _base_tokens: int = 0  # tokens generated before the current continuation
    _cached: int = 0  # the children's largest cached_tokens
    _detok: IncrementalDetokenizer | None = None
    _stops: StopMatcher | None = None

    def __post_init__(self) -> None:
        n = max(1, self.original.params.n)
        self.ids += [[] for _ in range(n - len(self.ids))]
        self.reasons += [None] * (n - len(self.reasons))

    @property
    def request_id(self) -> str:
        return self.original.request_id

    @property
    def sent_ids(self) -> list[int]:
        """Choice 0's token ids sent to the client."""
        return self.ids[0]

    @property
    def finish_reason(self) -> str | None:
        """Choice 0's finish reason, once sent."""
        return self.reasons[0]

    @property
    def streamed(self) -> bool:
        """Whether any choice has sent a token or ended."""
        return any(self.ids) or any(r is not None for r in self.reasons)

    def needs_prompt_ids(self) -> bool:
        """Whether the router must supply prompt_ids before calling request()."""
        return self.streamed and self.prompt_ids is None and self.original.prompt_ids is None

    def request(self) -> Generate | Split | list[ClientEvent]:
        """What to send the next replica (a Split: what to send for each choice); or, when the
        stream cannot go on there (or had ended and only its terminal event was lost), the
        events that end it."""
        if not self.streamed:
            self._continuing = False
            return self.original
        if self.tokenizer is None:
            return [self._lost("no tokenizer in the router")]
        prompt = self.original.prompt_ids if self.original.prompt_ids is not None else self.prompt_ids
        if prompt is None or (self.started is not None and len(prompt) != self.started.prompt_tokens):
            return [self._lost("its prompt's token ids are unknown to the router")]
        if len(self.ids) > 1:
            return self._split(prompt)
        left = self.original.params.max_tokens - len(self.sent_ids)
        if self.finish_reason is not None or left <= 0:  # it ended; only the terminal event was lost
            self._ensure_replay()
            return self._finish(self.finish_reason or "length", delta=self.finish_reason is None)
        self._ensure_replay()
        self._continuing = True
        self._base_tokens = len(self.sent_ids)
        p = self.original.params
        c = p.constraint
        constraint = None if c is None else msgspec.structs.replace(c, prefix_ids=c.prefix_ids + self.sent_ids)
        params = msgspec.structs.replace(p, max_tokens=left, constraint=constraint)
        return msgspec.structs.replace(self.original, prompt=None, messages=None, tools=None,
                                       prompt_ids=prompt + self.sent_ids, params=params, add_special=False)

    def cancel(self) -> ClientEvent:
        """The Cancelled that ends a stream the client cancelled between two replicas."""
        return self._end(Cancelled(self.request_id, self._whole_usage()))

    def see(self, event: ClientEvent) -> list[ClientEvent]:
        """The events the client sees for one event of the current replica (the terminal
        one ends the stream: `done`). A Failed from a replica that was lost is the router's
        to handle: it must not come here."""
        if self.done:
            return []
        if isinstance(event, Started):
            if self.started is not None:
                return []
            self.started = event
            return [event]
        if isinstance(event, Delta):
            return self._delta(event)
        if isinstance(event, (Finished, Cancelled)):
            if self._continuing:
                usage = self._usage(event.usage)
                if isinstance(event, Finished):
                    event = Finished(self.request_id, event.finish_reasons, usage, self._prompt())
                else:
                    event = Cancelled(self.request_id, usage)
            return [self._end(event)]
        if isinstance(event, Rejected) and self.started is not None:  # the client saw it start: it fails
            code = event.code if event.code == "bad_constraint" else LOST
            return [self._end(Failed(self.request_id, f"its replica was lost mid-stream and the next refused the "
                                     f"rest: {event.message}", code))]
        return [self._end(event)]

    def merge(self, index: int, event: ClientEvent) -> list[ClientEvent]:
        """The events the client sees for one event of the child continuing choice `index`
        (after a Split): its Deltas under that index, one Finished once every choice ended,
        the first other terminal event as the stream's end."""
        if self.done:
            return []
        if isinstance(event, Delta):
            self.ids[index].extend(event.token_ids)
            if event.finish_reason is not None:
                self.reasons[index] = event.finish_reason
            return [msgspec.structs.replace(event, request_id=self.request_id, index=index)]
        if isinstance(event, Finished):
            if self.reasons[index] is None:
                self.reasons[index] = event.finish_reasons[0] if event.finish_reasons else "length"
            self.children.pop(index, None)
            self._cached = max(self._cached, event.usage.cached_tokens)
            return [] if self.children else self._merged_finish()
        if isinstance(event, Cancelled):
            return [self.cancel()]
        if isinstance(event, (Failed, Rejected)):
            code = event.code if isinstance(event, Failed) or event.code == "bad_constraint" else LOST
            return [self._end(Failed(self.request_id, event.message, code))]
        return []  # Started: the client saw the first replica's

    def _split(self, prompt: list[int]) -> Split | list[ClientEvent]:
        """One child per unfinished choice (or, when every choice had ended and only the
        terminal event was lost, the Finished that ends the stream)."""
        p = self.original.params
        for i, reason in enumerate(self.reasons):
            if reason is None and len(self.ids[i]) >= p.max_tokens:
                self.reasons[i] = "length"  # its last Delta carried everything but the reason
        for i, reason in enumerate(self.reasons):
            if reason is not None:
                continue
            # choice i samples with seed + i, as the engine's front door seeds it
            seed = p.seed if p.seed is None or i == 0 else (p.seed + i) % (SEED_MAX + 1)
            child_req = msgspec.structs.replace(self.original, request_id=f"{self.request_id}/choice-{i}",
                                                params=msgspec.structs.replace(p, n=1, seed=seed))
            self.children[i] = RoutedStream(child_req, self.tokenizer, prompt, self.started, [list(self.ids[i])],
                                            moves=self.moves)
        if not self.children:
            return self._merged_finish()
        return Split(dict(self.children))

    def _merged_finish(self) -> list[ClientEvent]:
        """The Finished of a split stream, once every choice has ended."""
        reasons = [r or "length" for r in self.reasons]
        usage = self._whole_usage()
        usage.cached_tokens = min(self._cached, usage.prompt_tokens)
        return [self._end(Finished(self.request_id, reasons, usage, self._prompt()))]

    def _delta(self, d: Delta) -> list[ClientEvent]:
        if 0 <= d.index < len(self.ids):
            self.ids[d.index].extend(d.token_ids)
            if d.finish_reason is not None:
                self.reasons[d.index] = d.finish_reason
        if not self._continuing:
            return [d]
        assert self._detok is not None and self._stops is not None
        text = "".join(self._detok.push(t) for t in d.token_ids)
        if d.finish_reason:
            text += self._detok.flush()
        emit, hit = self._stops.feed(text)
        if hit:  # a stop string that spans the move: this stream ends here
            self.reasons[0] = "stop"
            return [msgspec.structs.replace(d, text=emit, finish_reason="stop"), *self._finish("stop", delta=False)]
        if d.finish_reason:
            emit += self._stops.flush()
        return [msgspec.structs.replace(d, text=emit)]

    def _ensure_replay(self) -> None:
        """A detokenizer and stop matcher in the state the lost replica's were in."""
        if self._detok is not None:
            return
        assert self.tokenizer is not None
        self._detok = IncrementalDetokenizer(self.tokenizer)
        self._stops = StopMatcher(list(self.original.params.stop))
        self._stops.feed("".join(self._detok.push(t) for t in self.sent_ids))

    def _finish(self, reason: str, delta: bool) -> list[ClientEvent]:
        """The events of a stream the router ends itself: with delta, a last Delta carrying
        the held-back text and the finish reason; then Finished."""
        out: list[ClientEvent] = []
        if delta:
            assert self._detok is not None and self._stops is not None
            out.append(Delta(self.request_id, text=self._stops.feed(self._detok.flush())[0] + self._stops.flush(),
                             finish_reason=reason))
        out.append(self._end(Finished(self.request_id, [reason], self._whole_usage(), self._prompt())))
        return out

    def _lost(self, why: str) -> ClientEvent:
        return self._end(Failed(self.request_id, f"its replica was lost mid-stream and {why}", LOST))

    def _whole_usage(self) -> Usage:
        """The original prompt and every token sent, over all choices."""
        return Usage(self.started.prompt_tokens if self.started else 0, sum(len(ids) for ids in self.ids))

    def _usage(self, u: Usage) -> Usage:
        """A continuation's usage as the whole stream's: the original prompt, every token generated."""
        prompt = self.started.prompt_tokens if self.started else u.prompt_tokens - self._base_tokens
        return Usage(prompt, self._base_tokens + u.completion_tokens, min(u.cached_tokens, prompt))

    def _prompt(self) -> list[int]:
        return list(self.original.prompt_ids or self.prompt_ids or [])

    def _end(self, event: ClientEvent) -> ClientEvent:
        self.done = True
        return event
