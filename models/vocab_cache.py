"""The tokenizer.json built from a GGUF vocabulary, cached on disk.

Building it (models/gguf_vocab.py: a vocab dict, the merges split, then JSON text) is
most of the tokenizer's start-up on a large vocabulary; the rest is
`tokenizers.Tokenizer.from_str`, which a cache cannot skip. An entry is keyed by a hash
of the `tokenizer.*` metadata itself (so any file with the same vocabulary shares it),
the source of gguf_vocab.py and this module, and the tokenizers version. Vocabularies
under MIN_TOKENS (tiny test models) are built every time; KEEP entries are kept;
ZINFER_VOCAB_CACHE=0 turns it off; a cache that cannot be read or written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import platformdirs
import structlog
import tokenizers

from zinfer.models import gguf_vocab

log = structlog.get_logger("zinfer.vocab_cache")

MIN_TOKENS = 20_000
KEEP = 8


def cache_root() -> Path:
    return Path(platformdirs.user_cache_dir("zinfer")) / "tokenizers"


def tokenizer_json(meta: Mapping[str, Any], root: Path | None = None) -> tuple[str, dict[str, Any]]:
    """(tokenizer.json text, {"decoder", "model": {"byte_fallback"}} of it) for GGUF metadata
    `meta`: read from the cache when an entry exists, else built (and stored when cached)."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    if os.environ.get("ZINFER_VOCAB_CACHE", "1") == "0" or len(tokens) < MIN_TOKENS:
        return _build(meta)
    path = (root or cache_root()) / f"{_key(meta)}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))  # {"decoding": {...}, "tokenizer": text}
        os.utime(path)
        return entry["tokenizer"], entry["decoding"]
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("tokenizer cache unreadable, building", path=str(path), error=str(exc))
    text, decoding = _build(meta)
    _store(path, json.dumps({"decoding": decoding, "tokenizer": text}, ensure_ascii=False))
    return text, decoding


def _build(meta: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    tj = gguf_vocab.tokenizer_dict_from_gguf(meta)
    byte_fallback = bool((tj.get("model") or {}).get("byte_fallback"))
    decoding = {"decoder": tj.get("decoder"), "model": {"byte_fallback": byte_fallback}}
    return json.dumps(tj, ensure_ascii=False), decoding


def _key(meta: Mapping[str, Any]) -> str:
    """Hash of every tokenizer.* value (lists of strings joined, numbers as their bytes) and of the code."""
    digest = hashlib.sha256(tokenizers.__version__.encode())
    for path in (Path(gguf_vocab.__file__), Path(__file__)):
        digest.update(path.read_bytes())
    for key in sorted(k for k in meta if k.startswith("tokenizer.")):
        value = meta[key]
        digest.update(b"\x01" + key.encode())
        if isinstance(value, list) and value and isinstance(value[0], str):
            digest.update("\x00".join(value).encode("utf-8", "surrogatepass"))
        elif isinstance(value, list):
            digest.update(np.asarray(value).tobytes() + str(np.asarray(value).dtype).encode())
        else:
            digest.update(repr(value).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:24]


def _store(path: Path, text: str) -> None:
    """Write an entry atomically (temp file, rename), then drop the oldest past KEEP."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        entries = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("tokenizer cache not written", path=str(path), error=str(exc))
