"""A model's fill-in-the-middle tokens, read from its vocabulary as llama.cpp reads them.

GGUF files may name them outright (`tokenizer.ggml.fim_pre_token_id`, ..._suf_, _mid_,
_rep_, _sep_); otherwise the vocabulary is searched for the texts the known code models
use, in llama.cpp's order (Qwen2.5-Coder and StarCoder's `<|fim_prefix|>`, CodeLlama's
`<PRE>`, DeepSeek-Coder's `<｜fim▁begin｜>`, ...). A model needs prefix, suffix and middle
to infill; repo and file separator are optional (they frame extra files of context), and
pad is the filler some models write after a middle. llama.cpp ends a generation at the pad,
repo and file separator tokens, as at EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

PREFIX_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>", "<｜fim▁begin｜>",
                "<|fim▁begin|>", "<fim▁begin>")
SUFFIX_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>", "<｜fim▁hole｜>",
                "<|fim▁hole|>", "<fim▁hole>")
MIDDLE_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>", "<｜fim▁end｜>",
                "<|fim▁end|>", "<fim▁end>")
REPO_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
SEP_TEXTS = ("<|file_sep|>", "<file_sep>")
PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>")


@dataclass(frozen=True)
class FimTokens:
    """The token ids of one model's FIM markers (repo and sep None where it has none)."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    sep: int | None = None
    pad: int | None = None

    @property
    def ends(self) -> list[int]:
        """The ids that end a generation as llama.cpp's end-of-generation set does: pad, repo, sep."""
        return [i for i in (self.pad, self.repo, self.sep) if i is not None]


def fim_tokens(token_to_id: Callable[[str], int | None], gguf_metadata: Mapping[str, Any]) -> FimTokens | None:
    """The model's FIM tokens, or None when its vocabulary lacks prefix, suffix or middle.

    token_to_id: the tokenizer's lookup of a token's text (None: not in the vocabulary)."""

    def find(key: str, texts: tuple[str, ...]) -> int | None:
        named = gguf_metadata.get(f"tokenizer.ggml.fim_{key}_token_id")
        if isinstance(named, int) and named >= 0:
            return named
        return next((i for t in texts if (i := token_to_id(t)) is not None), None)

    prefix, suffix, middle = find("pre", PREFIX_TEXTS), find("suf", SUFFIX_TEXTS), find("mid", MIDDLE_TEXTS)
    if prefix is None or suffix is None or middle is None:
        return None
    return FimTokens(prefix, suffix, middle, find("rep", REPO_TEXTS), find("sep", SEP_TEXTS),
                     find("pad", PAD_TEXTS))
