"""Stop rules of llama-server's /infill and /completion that the engine does not apply, decided
in the gateway as the text streams: where a fill-in-the-middle reaches the text after the hole
(`stop_at_suffix`, zinfer's, on by default for /infill), llama-server's `n_indent` and
`t_max_predict_ms`.

A rule that ends a generation cuts its text at a character position; nothing past the cut is
ever sent. While a cut could still fall before text already generated, that text is held back
(a partial line that may turn out to repeat the suffix, blank lines, the tail of a line that may
be the rest of the hole's line). When a rule fires, the engine request is cancelled and the
events end with the text up to the cut and a Finished ("stop"); `StreamCut.reason` says which
rule it was. A generation that ends by itself releases what was held, cut first where a rule
applies to its last line.

stop_at_suffix (the hole's end, from input_prefix and input_suffix; lines compare without
trailing whitespace):
- the rest of the hole's line: a hole inside a line whose rest R is not blank ends where the
  middle's first line, once ended by a newline, ends with R (`foo(` + `x)\\n` + suffix `)\\n`:
  the middle is `x`);
- a repeated suffix: a generated line (one that starts a line in the file) equal to the
  suffix's first non-blank line ends the middle before it and the blank lines before it; in a
  hole inside a line, the newline before it and a repeat of R at the end of the line before go
  too;
- a sibling of the suffix: a line that starts at the suffix's first line's indentation or less,
  and less than the middle's own first line's, ends the middle before it (a body filled at
  indentation 4, then `def other():` at 0 where the suffix goes on at 0: the middle is the body).
n_indent (llama-server's): a line after the first whose first character other than a space or
tab comes at a column under n_indent ends the text before that line.
t_max_predict_ms (llama-server's): once a newline has been generated, a token that comes more
than this many milliseconds after the first ends the text there (what is held is released as at
a natural end).
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import msgspec

from zinfer.gateway.progress import Events, OpenEvents
from zinfer.messages.client import Delta, Finished, Started, Usage

REST_LIMIT = 256  # characters of the hole's line's rest that the rest-of-line rule compares


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _blank(line: str) -> bool:
    return not line.strip()


def _bare(line: str) -> str:
    return line.rstrip(" \t\r")


@dataclass(frozen=True)
class SuffixStop:
    """Where the hole ends, read from the text around it."""

    line_start: bool  # the hole starts a line (the prefix is empty or ends with a newline)
    rest: str  # the rest of the hole's line after it, bare (empty at a line start or when blank)
    anchor: str | None  # the suffix's first non-blank whole line, bare (None: the suffix is blank)
    depth: int  # the indentation of the hole's line before it (a hole inside a line)

    @classmethod
    def around(cls, prefix: str, suffix: str) -> "SuffixStop":
        line_start = prefix == "" or prefix.endswith("\n")
        lines = suffix.split("\n")
        whole = lines if line_start else lines[1:]
        anchor = next((_bare(s) for s in whole if not _blank(s)), None)
        rest = "" if line_start else _bare(lines[0])
        return cls(line_start, rest if len(rest) <= REST_LIMIT else "", anchor,
                   _indent(prefix.rsplit("\n", 1)[-1]))


class StreamCut:
    """Decides, as a generation's text arrives, how much of it may go out and where it ends.

    feed(text) -> the text that may go out now; after a rule fires (`reason` set: "suffix",
    "indent" or "time"; `word`: the suffix text recognised) it has returned the rest up to the
    cut, and feeds return "". end() -> the text held back, once the generation ended by itself.
    """

    def __init__(self, suffix: SuffixStop | None, n_indent: int = 0, t_max_predict_ms: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.suffix, self.n_indent, self.t_max_s = suffix, n_indent, t_max_predict_ms / 1e3
        self.clock = clock
        self.t_first: float | None = None
        self.text = ""  # everything generated
        self.sent = 0  # characters of it that went out
        self.checked = 0  # whole lines before this position have been judged
        self.first_depth: int | None = None  # the indentation of the middle's first non-blank line
        self.reason: str | None = None
        self.word = ""

    def feed(self, text: str) -> str:
        if self.reason is not None:
            return ""
        t_first = self.t_first = self.t_first if self.t_first is not None else self.clock()
        self.text += text
        cut = self._cut()
        if cut is None and self.t_max_s > 0 and "\n" in self.text and self.clock() - t_first > self.t_max_s:
            cut = self._final_cut()
            self.reason = self.reason or "time"
        return self._out(cut if cut is not None else self._safe(), cut is not None)

    def end(self) -> str:
        if self.reason is not None:
            return ""
        cut = self._final_cut()
        return self._out(cut, True)

    def _out(self, upto: int, final: bool) -> str:
        upto = max(upto, self.sent)
        out = self.text[self.sent:upto]
        self.sent = upto
        if final:
            self.text = self.text[:upto]
        return out

    # the rules: each line is judged once it is whole (n_indent: once it shows its indentation)
    def _lines(self) -> list[tuple[int, str, bool]]:
        """(start, line, whole) of the lines from the first not yet judged; the last may be partial."""
        out = []
        start = self.checked
        while True:
            nl = self.text.find("\n", start)
            if nl < 0:
                out.append((start, self.text[start:], False))
                return out
            out.append((start, self.text[start:nl], True))
            start = nl + 1

    def _cut(self) -> int | None:
        for start, line, whole in self._lines():
            cut = self._judge(start, line, whole)
            if cut is not None:
                return cut
            if whole:
                self.checked = start + len(line) + 1
        return None

    def _final_cut(self) -> int:
        for start, line, whole in self._lines():
            cut = self._judge(start, line, whole, at_end=True)
            if cut is not None:
                return cut
        return len(self.text)

    def _judge(self, start: int, line: str, whole: bool, at_end: bool = False) -> int | None:
        """The cut this line makes (start: its position in the text), or None. At the end the last
        line counts as whole for the suffix's rules; n_indent needs a character after its indentation."""
        first = start == 0
        if self.n_indent > 0 and not first and (whole or not _blank(line)) and _indent(line) < self.n_indent:
            self.reason = "indent"
            return start
        s = self.suffix
        if s is None:
            return None
        whole = whole or at_end
        if first and not s.line_start:
            if whole and s.rest and "\n" in self.text and _bare(line).endswith(s.rest):
                self.reason, self.word = "suffix", s.rest
                return start + len(_bare(line)) - len(s.rest)
            return None
        if _blank(line) or s.anchor is None:
            return None
        # a sibling shows with its indentation; a repeat once whole
        if (_indent(line) <= _indent(s.anchor) and _indent(line) < self._depth()) or (
                whole and _bare(line) == s.anchor):
            self.reason, self.word = "suffix", s.anchor
            return self._back_off(start)
        return None

    def _depth(self) -> int:
        """The indentation of the middle's first line (a hole inside a line: of the hole's line)."""
        s = self.suffix
        assert s is not None
        if not s.line_start:
            return s.depth
        if self.first_depth is None:  # found once: the first line with something on it
            first = next((ln for ln in self.text.split("\n") if not _blank(ln)), None)
            self.first_depth = None if first is None else _indent(first)
        return self.first_depth if self.first_depth is not None else 0

    def _back_off(self, start: int) -> int:
        """The cut for a line at `start` that is past the middle's end: before the blank lines
        that precede it, and in a hole inside a line before the newline and a repeated rest."""
        s = self.suffix
        assert s is not None
        cut = start
        while cut > 0:
            before = self.text.rfind("\n", 0, cut - 1) + 1
            if not _blank(self.text[before:cut - 1]) or (before == 0 and not s.line_start):
                break
            cut = before
        if not s.line_start and cut > 0:
            cut -= 1  # the middle's last line goes on into the hole line's rest
            last = self.text[self.text.rfind("\n", 0, cut) + 1:cut]
            if s.rest and _bare(last).endswith(s.rest):
                cut -= len(last) - len(_bare(last)) + len(s.rest)
        return cut

    def _safe(self) -> int:
        """How much may go out: no later cut can fall before it."""
        start = self.text.rfind("\n") + 1
        line = self.text[start:]
        safe = len(self.text)
        first = start == 0
        if self.n_indent > 0 and not first and _blank(line):
            safe = start
        s = self.suffix
        if s is None:
            return safe
        if s.rest and not s.line_start:  # this line may end with the rest of the hole's line
            bare = _bare(line)
            k = next((k for k in range(min(len(bare), len(s.rest)), 0, -1) if bare.endswith(s.rest[:k])), 0)
            safe = min(safe, start + len(bare) - k)
        if s.anchor is not None and (not first or s.line_start):
            if _blank(line) or s.anchor.startswith(_bare(line)):  # it may become the suffix's line
                safe = min(safe, self._back_off(start))
        return safe


def cut_events(open_events: OpenEvents, cut: StreamCut, on_cut: Callable[[], None]) -> OpenEvents:
    """open_events with choice 0's text passed through `cut`: when a rule fires, the text up to
    the cut goes out in a last Delta, on_cut() is called (the request ended as it should: its
    metrics record finishes), the engine request is cancelled (its events closed) and a
    Finished("stop") ends the events, its usage counted from the events seen (tokens read from
    the prefix cache unknown: 0)."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[Events]:
        async with open_events() as events:
            passing = _cut(events, cut, on_cut)
            try:
                yield passing
            finally:
                await passing.aclose()

    return opened


async def _cut(events: Events, cut: StreamCut, on_cut: Callable[[], None]) -> Events:
    prompt_tokens = generated = 0
    try:
        async for event in events:
            if isinstance(event, Started):
                prompt_tokens = event.prompt_tokens
            elif isinstance(event, Delta) and event.index == 0:
                generated += len(event.token_ids)
                text = cut.feed(event.text)
                if cut.reason is not None:
                    on_cut()
                    yield msgspec.structs.replace(event, text=text, finish_reason="stop")
                    yield Finished(event.request_id, ["stop"], Usage(prompt_tokens=prompt_tokens,
                                                                     completion_tokens=generated))
                    return
                event = msgspec.structs.replace(event, text=text)
            elif isinstance(event, Finished):
                rest = cut.end()
                if rest:
                    yield Delta(event.request_id, text=rest)
            yield event
    finally:
        await events.aclose()
