"""Build a HuggingFace `tokenizers.Tokenizer` from GGUF tokenizer metadata.

`meta` is a plain mapping of decoded GGUF values (str, int, float, bool, lists), as
`GGUFFile(path).metadata` (and `gguf.GGUFReader(path).fields[key].contents()`) gives them. Two kinds are supported,
named by `tokenizer.ggml.model`, and both are built to tokenize as llama.cpp does:

- ``gpt2``: byte-level BPE from tokens + merges; the text is split by the regexes
  llama.cpp picks for `tokenizer.ggml.pre`, then byte-mapped and merged by rank.
- ``llama``: SentencePiece BPE from tokens + scores: spaces become "▁" (plus one in
  front when `add_space_prefix`), the whole text is merged by score (the merges are
  derived from the scores, highest first) and unknown characters fall back to
  <0xNN> byte tokens.

Control tokens (type 3) and unknown-type tokens (2) become special added tokens, and
user-defined tokens (4) plain added tokens, all matched on the raw text: llama.cpp
with parse_special=True splits the text on all of them before the model runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import tokenizers

from zinfer.models.gguf_file import GGUFFile

# llama.cpp token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

# tokenizer.ggml.pre -> (regexes applied in sequence, ignore_merges, add_bos default)
_PRE: dict[str, tuple[list[str], bool, bool]] = {
    "default": (_DEFAULT, False, False),
    **{n: ([_LLAMA3], True, True) for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral")},
    **{n: ([_QWEN2], False, False) for n in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez")},
    **{n: ([_GPT2], False, False) for n in ("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais")},
    **{n: ([r"\p{N}", _GPT2], False, False)
       for n in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")},
}

# Token texts llama.cpp treats as end-of-generation when present in the vocabulary.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
})


@dataclass(frozen=True)
class GGUFSpecials:
    """Special token ids and flags of a GGUF vocabulary (None where absent)."""

    bos_id: int | None
    eos_id: int | None
    eog_ids: frozenset[int]  # every id that ends generation: eos, eot, eom, <end_of_turn>, ...
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool  # SentencePiece only: a "▁" is put before the text
    chat_template: str | None


def specials_from_gguf(meta: Mapping[str, Any]) -> GGUFSpecials:
    """Read the special ids and the add-BOS/EOS flags as llama.cpp does, defaults included."""
    kind = meta.get("tokenizer.ggml.model", "gpt2")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    if kind == "llama":
        add_bos_default = True
    elif kind == "gpt2":
        add_bos_default = _pre_spec(meta)[2]
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (need 'gpt2' or 'llama')")

    def ident(key: str) -> int | None:
        v = meta.get(f"tokenizer.ggml.{key}")
        return int(v) if v is not None and 0 <= int(v) < len(tokens) else None

    eos = ident("eos_token_id")
    eog = {i for i in (eos, ident("eot_token_id"), ident("eom_token_id")) if i is not None}
    eog |= {i for i, t in enumerate(tokens) if t in EOG_TEXTS}
    return GGUFSpecials(
        bos_id=ident("bos_token_id"),
        eos_id=eos,
        eog_ids=frozenset(eog),
        unk_id=ident("unknown_token_id"),
        pad_id=ident("padding_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=kind == "llama" and bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def read_tokenizer_metadata(path: str) -> dict[str, Any]:
    """The `tokenizer.*` and `general.*` metadata of a GGUF file, decoded to plain values."""
    return {k: v for k, v in GGUFFile(path).metadata.items() if k.startswith(("tokenizer.", "general."))}


def tokenizer_json_from_gguf(meta: Mapping[str, Any]) -> str:
    """The tokenizer.json text equivalent to the GGUF vocabulary (for `zinfer convert`).

    It includes a post-processor that adds BOS/EOS where the model says so, so that
    HuggingFace users get the same ids with add_special_tokens=True.
    """
    return json.dumps(tokenizer_dict_from_gguf(meta), ensure_ascii=False)


def tokenizer_dict_from_gguf(meta: Mapping[str, Any]) -> dict[str, Any]:
    """tokenizer_json_from_gguf's object before serialization (a fresh dict per call)."""
    return _tokenizer_dict(meta)


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` that encodes as llama.cpp does (special tokens parsed)."""
    return tokenizers.Tokenizer.from_str(tokenizer_json_from_gguf(meta))


def _pre_spec(meta: Mapping[str, Any]) -> tuple[list[str], bool, bool]:
    pre = meta.get("tokenizer.ggml.pre") or "default"
    if pre not in _PRE:
        raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r}; known: {sorted(_PRE)}")
    return _PRE[pre]


def _tokenizer_dict(meta: Mapping[str, Any]) -> dict[str, Any]:
    kind = meta.get("tokenizer.ggml.model", "gpt2")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    sp = specials_from_gguf(meta)
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": types[i] in (CONTROL, UNKNOWN)}
        for i, t in enumerate(tokens) if types[i] in (CONTROL, UNKNOWN, USER_DEFINED)
    ]
    if kind == "gpt2":
        body = _bpe_body(meta, tokens)
    else:
        body = _spm_body(meta, tokens, types, sp)
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        **body, "post_processor": _post_processor(tokens, sp),
    }


def _bpe_body(meta: Mapping[str, Any], tokens: list[str]) -> dict[str, Any]:
    regexes, ignore_merges, _ = _pre_spec(meta)
    merges = []
    for m in meta["tokenizer.ggml.merges"]:
        cut = m.find(" ", 1)  # as llama.cpp: the first space after the first character
        merges.append([m[:cut], m[cut + 1:]])
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in regexes]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    return {
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [*splits, byte_level]},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def _spm_body(meta: Mapping[str, Any], tokens: list[str], types: list[int],
              sp: GGUFSpecials) -> dict[str, Any]:
    scores: list[float] = list(meta["tokenizer.ggml.scores"])
    vocab = {t: i for i, t in enumerate(tokens)}
    # llama.cpp merges the adjacent pair whose concatenation is the highest-scored token;
    # as BPE merges: every split of every mergeable token, ranked by that token's score.
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
    merges = []
    for i in order:
        if types[i] in (CONTROL, UNKNOWN, USER_DEFINED):
            continue  # always split off before the model runs
        t = tokens[i]
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                merges.append([t[:k], t[k:]])
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    normalizer: dict[str, Any] = replace
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
    ]
    if sp.add_space_prefix:
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, replace]}
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    unk = tokens[sp.unk_id] if sp.unk_id is not None else None
    return {
        "normalizer": normalizer,
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def _post_processor(tokens: list[str], sp: GGUFSpecials) -> dict[str, Any] | None:
    pre = [(tokens[sp.bos_id], sp.bos_id)] if sp.add_bos and sp.bos_id is not None else []
    post = [(tokens[sp.eos_id], sp.eos_id)] if sp.add_eos and sp.eos_id is not None else []
    if not pre and not post:
        return None

    def seq(name: str) -> list[dict[str, Any]]:
        return ([{"SpecialToken": {"id": t, "type_id": 0}} for t, _ in pre]
                + [{"Sequence": {"id": name, "type_id": 0}}]
                + [{"SpecialToken": {"id": t, "type_id": 0}} for t, _ in post])

    specials = {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in pre + post}
    return {"type": "TemplateProcessing", "single": seq("A"), "pair": seq("A") + seq("B"),
            "special_tokens": specials}
