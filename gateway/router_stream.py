"""One routed generation's stream across replicas: what the client has seen, what a moved
request sends to the next replica, and how that replica's events read as one stream.

A pure state machine (no I/O): gateway/router.py sends `request()` to a replica, passes each
event it gets through `see()` and yields what comes out. Its contracts:

- The client sees one Started (the first replica's), then Deltas, then exactly one terminal
  event, whatever number of replicas served the request.
- `request()` before any token was streamed is the original Generate (the same request_id):
  nothing was shown, so the next replica starts it afresh.
- After tokens were streamed (one choice only: n == 1, no constraint), `request()` continues
  it: prompt_ids = the prompt's ids + every token id already sent, max_tokens less those
  tokens, add_special off. The continuation's text is recomputed here from its token ids
  with a detokenizer and a stop matcher that were fed the tokens already sent, so the text
  has no gap and no duplicate (a character or a stop-string prefix the lost replica held
  back comes out now), and a stop string that spans the move still ends the stream. Its
  usage counts the original prompt and every generated token; Finished carries the
  original prompt ids.
- A stream that cannot continue (n > 1 or a grammar constraint after tokens were sent, or
  no prompt ids) ends with one Failed event naming why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from zinfer.messages.client import Cancelled, ClientEvent, Delta, Failed, Finished, Generate, Started, Usage
from zinfer.models.detokenize import IncrementalDetokenizer, StopMatcher
from zinfer.models.tokenizer import Tokenizer

LOST = "replica_lost"
"""Failed.code of a stream whose replica was lost and that could not be continued elsewhere."""


@dataclass
class RoutedStream:
    """The state of one routed Generate across the replicas that served it."""

    original: Generate
    tokenizer: Tokenizer | None = None  # to recompute a continuation's text; None: a move after tokens fails
    prompt_ids: list[int] | None = None  # the original prompt's ids, set by the router before a continuation
    started: Started | None = None
    sent_ids: list[int] = field(default_factory=list)  # every token id sent to the client (choice 0)
    finish_reason: str | None = None  # of choice 0, once a Delta carried one
    moves: int = 0  # replicas lost under this request
    done: bool = False
    cancelled: bool = False  # the client cancelled it while no replica held it
    _continuing: bool = False  # the current replica serves a continuation
    _base_tokens: int = 0  # tokens generated before the current continuation
    _detok: IncrementalDetokenizer | None = None
    _stops: StopMatcher | None = None

    @property
    def request_id(self) -> str:
        return self.original.request_id

    @property
    def resumable(self) -> bool:
        """Whether a continuation is possible once tokens were sent."""
        p = self.original.params
        return p.n == 1 and p.constraint is None and self.tokenizer is not None

    def needs_prompt_ids(self) -> bool:
        """Whether the router must supply prompt_ids before calling request()."""
        return bool(self.sent_ids) and self.prompt_ids is None and self.original.prompt_ids is None

    def request(self) -> Generate | list[ClientEvent]:
        """What to send the next replica; or, when the stream cannot go on there (or had ended
        and only its terminal event was lost), the events that end it."""
        if not self.sent_ids:
            self._continuing = False
            return self.original
        if not self.resumable:
            why = "n > 1" if self.original.params.n != 1 else "a grammar constraint" \
                if self.original.params.constraint is not None else "no tokenizer in the router"
            return [self._end(Failed(self.request_id, f"its replica was lost mid-stream and {why} "
                                     "cannot be continued on another", LOST))]
        prompt = self.original.prompt_ids if self.original.prompt_ids is not None else self.prompt_ids
        if prompt is None or (self.started is not None and len(prompt) != self.started.prompt_tokens):
            return [self._end(Failed(self.request_id, "its replica was lost mid-stream and its prompt's "
                                     "token ids are unknown to the router", LOST))]
        left = self.original.params.max_tokens - len(self.sent_ids)
        if self.finish_reason is not None or left <= 0:  # it ended; only the terminal event was lost
            self._ensure_replay()
            return self._finish(self.finish_reason or "length", delta=self.finish_reason is None)
        self._ensure_replay()
        self._continuing = True
        self._base_tokens = len(self.sent_ids)
        params = msgspec.structs.replace(self.original.params, max_tokens=left)
        return msgspec.structs.replace(self.original, prompt=None, messages=None, tools=None,
                                       prompt_ids=prompt + self.sent_ids, params=params, add_special=False)

    def cancel(self) -> ClientEvent:
        """The Cancelled that ends a stream the client cancelled between two replicas."""
        usage = Usage(self.started.prompt_tokens if self.started else 0, len(self.sent_ids))
        return self._end(Cancelled(self.request_id, usage))

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
        return [self._end(event)]

    def _delta(self, d: Delta) -> list[ClientEvent]:
        if d.index == 0:
            self.sent_ids.extend(d.token_ids)
            if d.finish_reason is not None:
                self.finish_reason = d.finish_reason
        if not self._continuing:
            return [d]
        assert self._detok is not None and self._stops is not None
        text = "".join(self._detok.push(t) for t in d.token_ids)
        if d.finish_reason:
            text += self._detok.flush()
        emit, hit = self._stops.feed(text)
        if hit:  # a stop string that spans the move: this stream ends here
            self.finish_reason = "stop"
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
        usage = Usage(self.started.prompt_tokens if self.started else 0, len(self.sent_ids))
        out.append(self._end(Finished(self.request_id, [reason], usage, self._prompt())))
        return out

    def _usage(self, u: Usage) -> Usage:
        """A continuation's usage as the whole stream's: the original prompt, every token generated."""
        prompt = self.started.prompt_tokens if self.started else u.prompt_tokens - self._base_tokens
        return Usage(prompt, self._base_tokens + u.completion_tokens, min(u.cached_tokens, prompt))

    def _prompt(self) -> list[int]:
        return list(self.original.prompt_ids or self.prompt_ids or [])

    def _end(self, event: ClientEvent) -> ClientEvent:
        self.done = True
        return event
