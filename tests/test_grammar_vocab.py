"""The grammar's tokenizer and the engine's agree on every token (issue 33): the same special
tokens, and the same bytes for every other one. llguidance marked every added token special,
so Qwen2.5's `<tool_call>` (an added token the engine treats as text) failed every forced
tool call with a 500."""

from __future__ import annotations

import numpy as np
import pytest
import tokenizers
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
from tiny import tiny_tokenizer_json, write_tiny_hf

from zinfer.actors.grammar_vocab import grammar_tokenizer
from zinfer.models.loader import open_model
from zinfer.models.prompt import PromptBuilder

LLGUIDANCE_MARKER = b"\xff"
"""llguidance spells special tokens as 0xFF + [id]: a token that is the lone byte 0xFF
(never part of valid UTF-8, so never of a grammar's text) cannot be told from one."""


@pytest.fixture(scope="module")
def tiny_with_tool_tokens(tmp_path_factory):
    """A tiny HF model whose vocabulary adds "<tool_call>" as text and "<|end|>" as special."""
    path = write_tiny_hf(tmp_path_factory.mktemp("vocab"), "qwen2", vocab_size=320)
    tok = tokenizers.Tokenizer.from_str(tiny_tokenizer_json())
    tok.add_tokens([tokenizers.AddedToken("<tool_call>", special=False, normalized=False)])
    tok.add_special_tokens(["<|end|>"])
    (path / "tokenizer.json").write_text(tok.to_str())
    return open_model(path), tok.token_to_id("<tool_call>"), tok.token_to_id("<|end|>")


def test_a_text_token_added_to_the_vocabulary_is_text_to_the_grammar(tiny_with_tool_tokens):
    source, tool, end = tiny_with_tool_tokens
    ll = grammar_tokenizer(source)
    assert not ll.is_special_token(tool) and ll.decode_bytes([tool]) == b"<tool_call>"
    assert ll.is_special_token(end)
    assert ll.tokenize_str("<tool_call>x")[0] == tool  # tokenized as the engine does: one token
    matcher = LLMatcher(ll, LLMatcher.grammar_from_lark('start: "<tool_call>" "x"'), log_level=0)
    mask = allocate_token_bitmask(1, ll.vocab_size)
    fill_next_token_bitmask(matcher, mask)
    allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), count=ll.vocab_size, bitorder="little"))
    assert list(allowed) == [tool]
    assert matcher.consume_token(tool), matcher.get_error()  # failed before: "forced bytes: got '<'"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
def test_every_token_is_the_same_to_llguidance_and_the_engine(name):
    source = open_model(name)
    ll, engine = grammar_tokenizer(source), PromptBuilder.from_source(source).tokenizer
    disagree = []
    for i in range(source.spec.vocab_size):
        special, ours = engine.is_special(i), engine.token_bytes(i)
        if ours == LLGUIDANCE_MARKER:
            continue
        if ll.is_special_token(i) != special or (not special and ll.decode_bytes([i]) != ours):
            disagree.append((i, engine.id_to_token(i)))
    assert not disagree, disagree[:20]
    assert len(engine.special_ids) > 0
