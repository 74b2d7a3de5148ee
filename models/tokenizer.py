"""The model's tokenizer: text <-> token ids, from GGUF metadata or a HuggingFace folder.

Encoding runs a `tokenizers.Tokenizer` (built from GGUF metadata to tokenize as
llama.cpp does, or loaded from tokenizer.json). Special tokens written in the text
("<|im_start|>") are parsed to their ids, as llama.cpp does with parse_special=True.

Decoding is defined byte-wise, as llama.cpp detokenizes: every token contributes
the bytes of its piece (`token_bytes`), the bytes are concatenated and read as UTF-8
with U+FFFD for invalid sequences. That definition is what lets the incremental
detokenizer (detokenize.py) reproduce a full decode exactly, chunk by chunk.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import tokenizers

from zinfer.models.gguf_vocab import EOG_TEXTS, specials_from_gguf
from zinfer.models.vocab_cache import tokenizer_json

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


class Tokenizer:
    """Encodes text to ids and decodes ids to text for one model.

    Attributes that callers read: `bos_id` (or None), `eos_ids` (every id that ends
    generation), `add_bos` / `add_eos` (what encode(add_special=True) adds),
    `chat_template` (jinja text or None), `bos_token` / `eos_token` (their texts,
    "" when absent), `vocab_size`.
    """

    def __init__(self, hf: tokenizers.Tokenizer, tokenizer_json: Mapping[str, Any], *,
                 bos_id: int | None, eos_id: int | None, eos_ids: Iterable[int], add_bos: bool,
                 add_eos: bool = False, chat_template: str | None = None) -> None:
        self._hf = hf
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids: frozenset[int] = frozenset(eos_ids) | ({eos_id} if eos_id is not None else set())
        self.add_bos = bool(add_bos and bos_id is not None)
        self.add_eos = bool(add_eos and self.eos_id is not None)
        self.chat_template = chat_template
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        added = hf.get_added_tokens_decoder()
        self._added: dict[int, str] = {i: t.content for i, t in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self._decoding = _decoding_style(tokenizer_json)
        self._bytes_cache: dict[int, bytes] = {}

    # ---- construction -------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build from decoded GGUF metadata (tokens, merges/scores, special ids, template)."""
        # cached on disk for large vocabularies (the decoder part kept apart: no parse of the text back)
        text, decoding = tokenizer_json(meta)
        sp = specials_from_gguf(meta)
        return cls(tokenizers.Tokenizer.from_str(text), decoding, bos_id=sp.bos_id,
                   eos_id=sp.eos_id, eos_ids=sp.eog_ids, add_bos=sp.add_bos,
                   add_eos=sp.add_eos, chat_template=sp.chat_template)

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load a HuggingFace folder: tokenizer.json, plus tokenizer_config.json (BOS/EOS,
        add_bos_token, chat_template), chat_template.jinja and generation_config.json
        (its eos_token_id list) when present."""
        root = Path(path)
        raw = (root / "tokenizer.json").read_text(encoding="utf-8")
        hf = tokenizers.Tokenizer.from_str(raw)
        cfg = read_json_object(root / "tokenizer_config.json")
        gen = read_json_object(root / "generation_config.json")

        def token_id(value: Any) -> int | None:
            if isinstance(value, dict):
                value = value.get("content")
            return hf.token_to_id(value) if isinstance(value, str) else None

        bos_id = token_id(cfg.get("bos_token"))
        if bos_id is None and isinstance(gen.get("bos_token_id"), int):
            bos_id = gen["bos_token_id"]
        eos_id = token_id(cfg.get("eos_token"))
        gen_eos = gen.get("eos_token_id")
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        if eos_id is None and gen_eos:
            eos_id = gen_eos[0]
        vocab = hf.get_vocab(with_added_tokens=True)
        eog = {i for i in [eos_id, *gen_eos] if i is not None}
        eog |= {vocab[t] for t in EOG_TEXTS if t in vocab}
        if "add_bos_token" in cfg:
            add_bos = bool(cfg["add_bos_token"])
        else:  # the tokenizer.json post-processor decides, as in transformers
            with_special = hf.encode("", add_special_tokens=True).ids
            add_bos = bos_id is not None and with_special[:1] == [bos_id]
        template = chat_template_from(cfg.get("chat_template"))
        jinja_file = root / "chat_template.jinja"
        if template is None and jinja_file.exists():
            template = jinja_file.read_text(encoding="utf-8")
        return cls(hf, json.loads(raw), bos_id=bos_id, eos_id=eos_id, eos_ids=eog,
                   add_bos=add_bos, add_eos=bool(cfg.get("add_eos_token", False)),
                   chat_template=template)

    # ---- text <-> ids -------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; with add_special, BOS (and EOS) as the model asks.

        Special-token texts inside `text` become their ids (llama.cpp parse_special).
        Goes through `encode_batch`, which releases the GIL while the library works (plain
        `encode` holds it, and a long text would stall every other thread)."""
        ids: list[int] = self._hf.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special and self.add_bos and self.bos_id is not None:  # add_bos implies a bos_id
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos and self.eos_id is not None:  # add_eos implies an eos_id
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The text of `ids`: their pieces' bytes joined, read as UTF-8 (U+FFFD where
        invalid). With skip_special, control tokens (BOS, <|im_end|>, ...) give nothing."""
        pieces = [self.token_bytes(i) for i in ids if not (skip_special and self.is_special(i))]
        if self._decoding["strip_leading_space"]:
            for k, p in enumerate(pieces):
                if p:
                    pieces[k] = p[1:] if p.startswith(b" ") else p
                    break
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token `token_id` contributes to decoded text (may be part of a
        UTF-8 character, e.g. <0xE4>). Special tokens give their own text."""
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._piece_bytes(token_id)
            self._bytes_cache[token_id] = cached
        return cached

    def is_special(self, token_id: int) -> bool:
        """Whether `token_id` is a control token that decode(skip_special=True) drops."""
        return token_id in self.special_ids

    def token_to_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly `text`, or None."""
        return self._hf.token_to_id(text)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary text of `token_id` (as stored: "Ġ"/"▁" markers included)."""
        return self._hf.id_to_token(token_id)

    @property
    def strips_leading_space(self) -> bool:
        """Whether decode drops one leading space (SentencePiece add_space_prefix)."""
        return bool(self._decoding["strip_leading_space"])

    @property
    def bos_token(self) -> str:
        return (self._hf.id_to_token(self.bos_id) or "") if self.bos_id is not None else ""

    @property
    def eos_token(self) -> str:
        return (self._hf.id_to_token(self.eos_id) or "") if self.eos_id is not None else ""

    # ---- internals ----------------------------------------------------------------

    def _piece_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} out of range [0, {self.vocab_size})")
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        tok = self._hf.id_to_token(token_id)
        if tok is None:
            return b""
        style = self._decoding
        if style["byte_level"]:
            table = _unicode_to_byte()
            if all(c in table for c in tok):
                return bytes(table[c] for c in tok)
            return tok.encode("utf-8")
        if style["byte_fallback"]:
            m = _BYTE_TOKEN.fullmatch(tok)
            if m:
                return bytes([int(m.group(1), 16)])
        if style["metaspace"]:
            tok = tok.replace("\u2581", " ")
        elif style["other"]:
            return self._hf.decode([token_id], skip_special_tokens=False).encode("utf-8")
        return tok.encode("utf-8")


def _decoding_style(tj: Mapping[str, Any]) -> dict[str, bool]:
    """How tokenizer.json's decoder turns pieces into bytes, reduced to four flags."""
    decoders: list[Mapping[str, Any]] = []
    stack = [tj.get("decoder")]
    while stack:
        d = stack.pop()
        if isinstance(d, Mapping):
            decoders.append(d)
            stack.extend(d.get("decoders") or [])
    types = {d.get("type") for d in decoders}
    metaspace = "Metaspace" in types or any(
        d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == "\u2581"
        for d in decoders)
    strip = any(d.get("type") == "Strip" and d.get("start", 0) >= 1 for d in decoders) or any(
        d.get("type") == "Metaspace" and d.get("prepend_scheme", "always") != "never"
        and d.get("add_prefix_space", True) for d in decoders)
    byte_level = "ByteLevel" in types
    return {
        "byte_level": byte_level,
        "byte_fallback": bool((tj.get("model") or {}).get("byte_fallback")),
        "metaspace": metaspace,
        "strip_leading_space": strip and not byte_level,
        "other": not byte_level and not metaspace,
    }


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in the file at `path` ({} when there is no such file)."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return data


def chat_template_from(value: Any) -> str | None:
    """tokenizer_config's chat_template: a string, or a list of {name, template}."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None
