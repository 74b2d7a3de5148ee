"""Whether a draft model may draft for a target: the same vocabulary, token for token.

Speculative decoding passes token ids between the two models, so an id must mean the same text
in both: the tokenizers must have the same size, the same text at every id, and the same
special ids (BOS, EOS and every end-of-generation id). The embedding matrices may be padded
past the tokenizer's size (rows no text maps to), by different amounts in the two models: the
drafter never proposes an id past the tokenizer's size.
"""

from __future__ import annotations

from zinfer.models.tokenizer import Tokenizer


class VocabMismatch(ValueError):
    """The draft model's vocabulary differs from the target's; the message says where."""


def check_same_vocab(target: Tokenizer, draft: Tokenizer, target_rows: int, draft_rows: int) -> int:
    """Raise VocabMismatch naming the first difference between the two tokenizers (sizes, the
    text of an id, BOS, EOS or end-of-generation ids), or an embedding smaller than its
    tokenizer. Returns the shared vocabulary size: the ids a draft may propose."""
    n, m = target.vocab_size, draft.vocab_size
    if n != m:
        raise VocabMismatch(f"the draft model's tokenizer has {m} tokens, the target's {n}")
    for rows, who in ((target_rows, "target"), (draft_rows, "draft model")):
        if rows < n:
            raise VocabMismatch(f"the {who}'s embedding has {rows} rows for a tokenizer of {n} tokens")
    for what, a, b in (("BOS", target.bos_id, draft.bos_id), ("EOS", target.eos_id, draft.eos_id),
                       ("end-of-generation ids", sorted(target.eos_ids), sorted(draft.eos_ids))):
        if a != b:
            raise VocabMismatch(f"the draft model's {what} is {b}, the target's {a}")
    for i in range(n):
        a_text, b_text = target.id_to_token(i), draft.id_to_token(i)
        if a_text != b_text:
            raise VocabMismatch(f"token {i} is {b_text!r} in the draft model, {a_text!r} in the target")
    return n
