"""The model's vocabulary as llguidance reads it: the engine's own tokenizer
(models/tokenizer.py), so both agree on every token's bytes, on which tokens are special,
and on how a text is tokenized.

llguidance's own loader of a tokenizer.json marks every added token special, and a special
token matches no grammar text; the engine treats the added tokens a GGUF marks user-defined
(Qwen2.5's `<tool_call>`, say) as text, and so, through this module, does llguidance: a
grammar that requires such a text (a forced tool call's `<tool_call>`) can be followed.
Building from the engine's tokens is also faster than llguidance's loader (BENCHMARKS.md,
"actors/grammar_vocab.py").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llguidance import LLTokenizer
from llguidance._tokenizer import TokenizerWrapper

from zinfer.models.prompt import PromptBuilder

if TYPE_CHECKING:
    from zinfer.models.loader import ModelSource
    from zinfer.models.tokenizer import Tokenizer


class EngineTokens:
    """The engine's tokenizer in the shape llguidance's TokenizerWrapper reads: every id's
    bytes (b"" past the tokenizer's own vocabulary, for the model's padding rows), the special
    ids, and a call that tokenizes UTF-8 bytes as the engine does (special texts included)."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) if i < tokenizer.vocab_size else b"" for i in range(n_vocab)]
        self.special_token_ids = sorted(tokenizer.special_ids)

    def __call__(self, text: bytes) -> list[int]:
        return self.tokenizer.encode(text.decode("utf-8", errors="replace"), add_special=False)


def grammar_tokenizer(source: ModelSource) -> LLTokenizer:
    """The vocabulary of source for llguidance, its EOS tokens those the front door actor
    gives the scheduler (Tokenizer.eos_ids), so "grammar complete" is a token that ends the
    sequence. Takes about a second: build once."""
    tokenizer = PromptBuilder.from_source(source).tokenizer
    if not tokenizer.eos_ids:
        raise ValueError("the model names no EOS token, so a constrained output could never end")
    n_vocab = source.spec.vocab_size
    wrapper = TokenizerWrapper(EngineTokens(tokenizer, n_vocab))
    return LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=sorted(tokenizer.eos_ids))
