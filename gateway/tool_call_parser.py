"""The model's text, as it streams, split into content and tool calls, reading the forms
models really write (as leniently as llama-server's parsers):

- Hermes and Qwen's blocks (zinfer's fallback prompt asks for them too, models/tool_prompt.py),
  one per call, anywhere in the text:

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

- a fenced block (```json, ``` or ```tool_call) holding a call object or a list of them,
  anywhere in the text: what Qwen2.5-Coder writes when asked "What's the weather in Paris?";
- the whole message one call object or a list of them, optionally after Llama 3's
  <|python_tag|>.

A call object is {"name": ..., "arguments" | "parameters": {...} or its JSON text}, or the
same inside {"function": ...}. Outside the tags, a call must name an offered function. A
block or fence whose JSON is not a call stays in the content as it was written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
FENCE = "```"
FENCE_INFOS = ("", "json", "tool_call", "tool_calls", "function")
"""Fence info strings whose block may hold calls (a ```python block is code, not a call)."""
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class Call:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass
class ToolCallParser:
    """Splits a choice's text, fed as it streams, into content and Calls.

    feed() and finish() return pieces in order: str (content) or Call. Text that may still
    become a tag or a fence is held back, so no part of "<tool_call>" leaks into content,
    and a fence is held until it closes; whitespace between content and a call is dropped.
    With `names` (the offered functions), a message that opens with "{", "[" or
    <|python_tag|> is held whole and read as JSON at finish(). The same pieces come out
    however the text is split, so a stream reassembles to the whole response.
    """

    names: set[str] = field(default_factory=set)
    buf: str = ""
    state: str = "start"  # start (nothing decided), text, call (inside a tag), fence (inside ```), json (held whole)
    after_call: bool = False
    gap: str = ""  # the whitespace dropped before an open tag or fence

    def feed(self, text: str) -> list[str | Call]:
        self.buf += text
        out: list[str | Call] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[str | Call]) -> bool:
        """One move of the state machine; False when it needs more text."""
        if self.state == "start":
            head = self.buf.lstrip()
            tag_so_far = len(head) < len(PYTHON_TAG) and PYTHON_TAG.startswith(head)  # may grow into the tag
            if not head or (self.names and tag_so_far):
                return False
            self.state = "json" if self.names and head.startswith(("{", "[", PYTHON_TAG)) else "text"
            return True
        if self.state == "json":
            return False
        if self.state == "text":
            return self._text(out)
        if self.state == "call":
            return self._call(out)
        return self._fence(out)

    def _call(self, out: list[str | Call]) -> bool:
        """Inside a tag: once a close tag ends a whole JSON text, its calls, or the block as
        written. A close tag inside a JSON string (a model wrote "Malt</tool_call>" as a city)
        does not end the block: the next one is tried."""
        j = self.buf.find(TOOL_CLOSE)
        while j >= 0:
            body = self.buf[:j]
            if _is_json(body):
                self.buf, self.state = self.buf[j + len(TOOL_CLOSE) :], "text"
                self._block(out, _as_calls(body.strip(), None), TOOL_OPEN + body + TOOL_CLOSE)
                return True
            j = self.buf.find(TOOL_CLOSE, j + 1)
        return False  # no close yet, or none ends whole JSON: finish() decides

    def _text(self, out: list[str | Call]) -> bool:
        markers = [TOOL_OPEN, FENCE] if self.names else [TOOL_OPEN]
        found = [(i, m) for m in markers if (i := self.buf.find(m)) >= 0]
        if not found:
            keep = len(self.buf) - _undecided_tail(self.buf, markers)
            self._content(out, self.buf[:keep])
            self.buf = self.buf[keep:]
            return False
        i, marker = min(found)
        before = self.buf[:i].rstrip()
        self._content(out, before)
        self.gap = "" if self.after_call else self.buf[len(before) : i]  # put back if the block is no call
        if marker == TOOL_OPEN:
            self.buf, self.state = self.buf[i + len(TOOL_OPEN) :], "call"
        else:
            self.buf, self.state = self.buf[i:], "fence"
        return True

    def _fence(self, out: list[str | Call]) -> bool:
        """buf starts with a fence: once it closes, its calls, or the fence as written."""
        nl = self.buf.find("\n", len(FENCE))
        close = self.buf.find(FENCE, nl + 1) if nl >= 0 else -1
        if close < 0:
            return False
        block, self.buf, self.state = self.buf[: close + len(FENCE)], self.buf[close + len(FENCE) :], "text"
        self._block(out, self._fenced_calls(block), block)
        return True

    def _fenced_calls(self, block: str) -> list[Call] | None:
        """The calls of a fence's text (closed or not), or None."""
        nl = block.find("\n")
        if nl < 0 or block[len(FENCE) : nl].strip().lower() not in FENCE_INFOS:
            return None
        return _as_calls(block[nl + 1 :].removesuffix(FENCE).strip(), self.names)

    def finish(self) -> list[str | Call]:
        """The pieces held back, once the choice's text has ended."""
        out: list[str | Call] = []
        rest, self.buf = self.buf, ""
        if self.state == "json":
            calls = _as_calls(rest.strip().removeprefix(PYTHON_TAG).strip(), self.names)
            out.extend(calls if calls else [rest])
        elif self.state == "call":  # an unclosed last block counts when its JSON is whole
            self._block(out, _as_calls(rest.strip().removesuffix(TOOL_CLOSE).strip(), None), TOOL_OPEN + rest)
        elif self.state == "fence":
            self._block(out, self._fenced_calls(rest), rest)
        elif not (self.after_call and not rest.strip()):
            self._content(out, rest)
        return out

    def _content(self, out: list[str | Call], text: str) -> None:
        if self.after_call:
            text = text.lstrip()
        if text:
            out.append(text)
            self.after_call = False

    def _block(self, out: list[str | Call], calls: list[Call] | None, as_written: str) -> None:
        if calls:
            out.extend(calls)
            self.after_call = True
        else:
            out.append(self.gap + as_written)
            self.after_call = False


def _undecided_tail(text: str, markers: list[str]) -> int:
    """Length of text's end that may still grow into a marker (a tag or a fence): a prefix
    of one and the whitespace before it (whitespace alone too)."""
    n = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-k:]):
                n = max(n, k)
                break
    return len(text) - len(text[: len(text) - n].rstrip())


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _as_calls(text: str, names: set[str] | None) -> list[Call] | None:
    """The calls a JSON text holds (one call object, or a non-empty list of them), or None
    when it holds anything else (or, with `names`, names a function outside them)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) and obj else [obj]
    calls = [c for item in items if (c := _as_call(item, names)) is not None]
    return calls if len(calls) == len(items) else None


def _as_call(obj: Any, names: set[str] | None) -> Call | None:
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]  # OpenAI's own shape
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    args: Any = next((obj[k] for k in ARGUMENT_KEYS if k in obj), {})
    if isinstance(args, str):
        return Call(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_tool_calls(text: str, names: set[str] | None = None) -> tuple[str | None, list[Call]]:
    """(content, calls) of a whole choice's text: content is the text outside the calls,
    None when it is empty and there are calls."""
    p = ToolCallParser(set(names or ()))
    pieces = p.feed(text) + p.finish()
    content = "".join(x for x in pieces if isinstance(x, str))
    calls = [x for x in pieces if isinstance(x, Call)]
    return (content or None) if calls else content, calls
