"""Shared fixtures: the real models, when pulled (`zinfer pull NAME`), else a clean skip."""

from __future__ import annotations

import pytest

from zinfer.models.pull import cached_path


def _model(name: str):
    path = cached_path(name)
    if path is None:
        pytest.skip(f"model {name} not pulled: run `zinfer pull {name}`")
    return path


@pytest.fixture(scope="session")
def smollm2_path():
    """Path of SmolLM2-135M-Instruct Q4_1 GGUF (llama arch, gpt2 BPE tokenizer)."""
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path():
    """Path of Gemma 3 270M Q4_K_M GGUF (gemma3 arch, SentencePiece tokenizer)."""
    return _model("gemma3-270m")
