"""The front door actor's heavy work (chat templates, encoding, decoding) off its event loop.

Two facts shape this module:

- The `tokenizers` library's plain `encode` keeps the GIL for its whole run, while
  `encode_batch` releases it (BENCHMARKS.md, "actors/prompt_encoding.py"); `Tokenizer.encode`
  (models/tokenizer.py) uses the latter, so a worker thread really frees the loop.
- A prompt's length in characters bounds its length in tokens from below: a token stands
  for at most `longest_piece` characters of the text (the longest piece of the
  vocabulary in bytes; every character is at least one byte), so a text of more than
  max_model_len x longest_piece characters has more than max_model_len tokens.
  `PromptLimits.check_text` refuses such a text without encoding it, and never refuses
  one that could fit. (This holds for tokenizers whose normalizer never merges
  characters: the GGUF-built ones only replace and prepend, which adds characters.)

`EncodingWorker.run` runs small inputs inline (a thread hop costs more than they do) and
large ones in one worker thread: a big prompt delays no other request's deltas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import msgspec
import trio

from zinfer.messages.client import Generate, Messages, Tokenize, Tools
from zinfer.models.prompt import PromptBuilder
from zinfer.models.tokenizer import Tokenizer

T = TypeVar("T")

INLINE_MAX = 8192
"""Inputs up to this many characters (or token ids) are encoded or decoded inline."""


class PromptTooLong(ValueError):
    """The prompt cannot fit the context; n_tokens is 0 when it was refused unencoded."""

    def __init__(self, message: str, n_tokens: int = 0) -> None:
        super().__init__(message)
        self.n_tokens = n_tokens


def longest_piece(tokenizer: Tokenizer) -> int:
    """The most bytes one token of the vocabulary decodes to (fills its byte cache)."""
    return max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))


@dataclass(frozen=True)
class PromptLimits:
    """What a prompt may be: fewer than max_model_len tokens, at most max_chars characters."""

    max_model_len: int
    max_chars: int  # max_model_len x the vocabulary's longest piece

    @staticmethod
    def for_tokenizer(tokenizer: Tokenizer, max_model_len: int) -> "PromptLimits":
        return PromptLimits(max_model_len, max_model_len * longest_piece(tokenizer))

    def check_text(self, chars: int) -> None:
        """Raise PromptTooLong when a text of `chars` characters certainly has too many tokens."""
        if chars > self.max_chars:
            raise PromptTooLong(f"the prompt has {chars} characters, more than the {self.max_chars} that "
                                f"{self.max_model_len} tokens of this vocabulary can hold")

    def check_ids(self, n: int) -> None:
        """Raise PromptTooLong when n prompt tokens leave no room to generate."""
        if n >= self.max_model_len:
            raise PromptTooLong(f"the prompt has {n} tokens, the context holds {self.max_model_len}", n)


def input_size(req: Generate | Tokenize) -> int:
    """Characters (text, message contents) or token ids a request asks to encode."""
    text = req.prompt if isinstance(req, Generate) else req.text
    ids = req.prompt_ids if isinstance(req, Generate) else None
    if text is not None:
        return len(text)
    if req.messages is not None:
        tools = len(msgspec.json.encode(req.tools)) if req.tools else 0  # their JSON is rendered too
        return tools + sum(len(msgspec.json.encode(m)) for m in req.messages)
    return len(ids or ())


def encode_text_or_chat(prompts: PromptBuilder, limits: PromptLimits, text: str | None, messages: Messages | None,
                        add_special: bool, tools: Tools | None = None) -> list[int]:
    """Token ids of text, or of chat messages (and tools) rendered through the template (may be empty).

    A text (or rendered chat) longer than limits.max_chars raises PromptTooLong
    unencoded; bad messages raise ValueError naming what is wrong."""
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of text or messages")
    if messages is not None:
        text, add_special = prompts.render(messages, tools), False  # the template writes BOS itself
    assert text is not None  # exactly one of text and messages (checked above)
    limits.check_text(len(text))
    return prompts.tokenizer.encode(text, add_special)


def encode_prompt(prompts: PromptBuilder, limits: PromptLimits, req: Generate) -> list[int]:
    """The prompt ids of a generation, from exactly one of prompt, messages or prompt_ids.

    Raises PromptTooLong when it cannot fit the context, ValueError on other bad input."""
    if sum(x is not None for x in (req.prompt, req.messages, req.prompt_ids)) != 1:
        raise ValueError("give exactly one of prompt, messages or prompt_ids")
    if req.prompt_ids is not None:
        limits.check_ids(len(req.prompt_ids))
        ids = prompts.prompt_ids(None, None, req.prompt_ids)
    else:
        ids = encode_text_or_chat(prompts, limits, req.prompt, req.messages, req.add_special, req.tools)
        if not ids:
            raise ValueError("the prompt is empty")
    limits.check_ids(len(ids))
    return ids


class EncodingWorker:
    """Runs the actor's heavy calls: inline when small, else in one thread at a time."""

    def __init__(self, threads: int = 1) -> None:
        self.limiter = trio.CapacityLimiter(threads)

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """fn(*args), in a worker thread when size > INLINE_MAX. Cancelling abandons the thread."""
        if size <= INLINE_MAX:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter, abandon_on_cancel=True)
