"""Streaming text out of generated ids: incremental detokenizing and stop strings.

`IncrementalDetokenizer` turns ids into text one id at a time and never emits half a
UTF-8 character: the bytes of an unfinished character wait for the next token.
All pushes followed by `flush()` concatenate to exactly `tokenizer.decode(ids)`.

`StopMatcher` sits after it: it passes text through, holding back any tail that could
still become a stop string, and cuts the text before the first stop string it sees.
"""

from __future__ import annotations

import codecs

from zinfer.models.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Decodes a growing id sequence chunk by chunk, UTF-8 safe.

    Mutates only its own buffer; the tokenizer is read-only here."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = tokenizer.strips_leading_space  # until the first non-empty piece

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes ("" while a character
        is still incomplete or the id is a skipped special token)."""
        if self._skip_special and self._tok.is_special(token_id):
            return ""
        piece = self._tok.token_bytes(token_id)
        if self._strip_space and piece:
            self._strip_space = False
            if piece.startswith(b" "):
                piece = piece[1:]
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """End of the sequence: return what is held back (U+FFFD for a cut character)."""
        return self._utf8.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings in streamed text, across chunk boundaries.

    `feed(delta)` returns `(text, stopped)`: `text` is safe to show now and never
    contains (any part of) a stop string; once `stopped` is True the generation should
    end and later feeds return ("", True). `flush()` returns the held-back tail when the
    generation ends for another reason.
    """

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add newly decoded text; return what can be emitted and whether a stop hit."""
        if self.stopped:
            return "", True
        buf = self._held + delta
        hits = [(buf.find(s), s) for s in self._stops]
        hits = [(at, s) for at, s in hits if at >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda h: (h[0], -len(h[1])))
            self.stopped = True
            self._held = ""
            return buf[:at], True
        keep = self._partial_len(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held-back text, for a generation that ended without a stop string."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _partial_len(self, buf: str) -> int:
        """Length of the longest tail of `buf` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
