"""The gateway's stop rules for llama-server's /infill and /completion (gateway/llama_server_stops.py):
where a middle reaches the hole's end (stop_at_suffix), n_indent and t_max_predict_ms, and that
a stream never sends text past the cut, however the text is split into pieces."""

from __future__ import annotations

import random

import pytest
import trio

from zinfer.gateway.llama_server_stops import StreamCut, SuffixStop, cut_events
from zinfer.messages.client import Delta, Finished, Started, Usage

PALINDROME = ('def is_palindrome(text: str) -> bool:\n    """True when text reads the same backwards."""\n',
              "\n\ndef count_words(text: str) -> int:\n    return len(text.split())\n")
# (prefix, suffix, what the model wrote, the middle, the reason)
CASES = [
    # a body, then the model repeats the suffix
    (*PALINDROME, "    cleaned = normalize(text)\n    return cleaned == cleaned[::-1]\n\n\ndef count_words(text",
     "    cleaned = normalize(text)\n    return cleaned == cleaned[::-1]\n", "suffix"),
    # a body, then a sibling function the suffix does not have
    (*PALINDROME, "    return text == text[::-1]\n\n\ndef count_sentences(text: str) -> int:\n    return 0\n",
     "    return text == text[::-1]\n", "suffix"),
    # an argument: the model writes the rest of the line
    ("def load(text):\n    given = json.loads(", ")\n    return given\n",
     "text)\n    return given\n\n\ndef describe(", "text", "suffix"),
    # a condition, the rest of the line and the next lines repeated
    ("def classify(n):\n    if ", ':\n        return "negative"\n    return "positive"\n',
     'n < 0:\n        return "negative"\n    return "positive"\n\nprint(classify(1))\n', "n < 0", "suffix"),
    # a hole at a line's end: the next line repeated
    ("def total(xs):\n    s = ", "\n    return s\n", "sum(xs)\n    return s\n", "sum(xs)", "suffix"),
    # a multi-line middle inside a line, the rest of the line left out by the model
    ("x = [", "]\nprint(x)\n", "\n    1,\n    2,\nprint(x)\n", "\n    1,\n    2,", "suffix"),
    # a method body in a class: the next method repeated after a blank line
    ("class S:\n    def pop(self):\n", "\n    def peek(self):\n        return 1\n",
     "        return self.items.pop()\n\n    def peek(self):\n", "        return self.items.pop()\n", "suffix"),
    # the model ends by itself: nothing cut
    (*PALINDROME, "    return text == text[::-1]\n", "    return text == text[::-1]\n", None),
]


def streamed(cut: StreamCut, pieces: list[str]) -> str:
    """What goes out, checking at every step that it stays a prefix of what goes out in the end."""
    out = ""
    for piece in pieces:
        out += cut.feed(piece)
        if cut.reason is not None:
            return out
    return out + cut.end()


def splits(text: str, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 12))) if len(text) > 1 else []
    ragged = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    return [[text], list(text), ragged]


@pytest.mark.parametrize("prefix, suffix, written, middle, reason", CASES)
def test_the_middle_ends_where_it_reaches_the_suffix_however_it_streams(prefix, suffix, written, middle, reason):
    for pieces in splits(written, seed=len(written)):
        cut = StreamCut(SuffixStop.around(prefix, suffix))
        sent, emitted = "", []
        for piece in pieces:
            emitted.append(cut.feed(piece))
            sent += emitted[-1]
            assert middle.startswith(sent), (pieces, sent)  # never past the cut
            if cut.reason is not None:
                break
        if cut.reason is None:
            sent += cut.end()
        assert sent == middle and cut.reason == reason, pieces


def test_the_stops_file_compiles_with_each_middle():
    for prefix, suffix, _, middle, _ in CASES:
        compile(prefix + middle + suffix, "hole.py", "exec")


def test_off_without_a_suffix_rule_and_n_indent_stops_at_a_shallower_line():
    text = "x = 1\n    y = 2\n  z = 3\n"
    assert streamed(StreamCut(None), list(text)) == text
    cut = StreamCut(None, n_indent=4)
    assert streamed(cut, list(text)) == "x = 1\n    y = 2\n" and cut.reason == "indent"
    cut = StreamCut(None, n_indent=4)  # llama-server's rule: an empty line is shallower too
    assert streamed(cut, ["a\n", "    b\n", "\n", "    c"]) == "a\n    b\n" and cut.reason == "indent"
    cut = StreamCut(None, n_indent=4)  # but the end of a text that ends with a newline is not a line
    assert streamed(cut, ["a\n", "    b\n"]) == "a\n    b\n" and cut.reason is None


def test_t_max_predict_ms_ends_after_a_newline_once_the_time_is_up():
    now = [0.0]
    cut = StreamCut(None, t_max_predict_ms=100, clock=lambda: now[0])
    assert cut.feed("a") == "a"
    now[0] = 0.5  # past the time, but no newline yet: goes on
    assert cut.feed("b") == "b" and cut.reason is None
    assert cut.feed("\nc") == "\nc" and cut.reason == "time"
    assert cut.feed("d") == ""


def test_cut_events_end_with_the_cut_and_close_the_engine_stream():
    prefix, suffix = "    given = json.loads(", ")\n    return given\n"
    closed, ended = [], []

    async def engine():
        try:
            yield Started("r", prompt_tokens=7)
            for i, piece in enumerate(["te", "xt)", "\n", "    return", " given\n", "more"]):
                yield Delta("r", text=piece, token_ids=[i])
            yield Finished("r", ["length"], Usage(prompt_tokens=7, completion_tokens=6))
        finally:
            closed.append(True)

    async def main():
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def open_events():
            events = engine()
            try:
                yield events
            finally:
                await events.aclose()

        cut = StreamCut(SuffixStop.around(prefix, suffix))
        async with cut_events(open_events, cut, lambda: ended.append(True))() as events:
            return [e async for e in events]

    got = trio.run(main)
    text = "".join(e.text for e in got if isinstance(e, Delta))
    assert text == "text" and isinstance(got[-1], Finished) and got[-1].finish_reasons == ["stop"]
    assert got[-1].usage.prompt_tokens == 7 and got[-1].usage.completion_tokens == 3
    assert closed == [True] and ended == [True]
