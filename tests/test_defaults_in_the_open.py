"""Defaults a user can see (issue 33): --version, every option's default in --help, the
model's own context, max_tokens past the context refused rather than clamped, and the
server's sampling defaults (the model's recommended ones, else OpenAI's) named in /v1/models."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest
from http_server import running_server
from tiny import write_tiny_gguf, write_tiny_hf

from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import Client
from zinfer.gateway.openai_schema import ChatRequest, sampling_params
from zinfer.messages.client import Rejected
from zinfer.messages.params import SamplingParams
from zinfer.models.sampling_defaults import SamplingDefaults, sampling_defaults


def zinfer(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "zinfer.gateway.cli", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_version_and_every_default_in_help():
    assert zinfer("--version").startswith("zinfer ")
    run, serve = " ".join(zinfer("run", "--help").split()), " ".join(zinfer("serve", "--help").split())
    for words in ("--temperature TEMPERATURE 0 is greedy (default: 0.2)", "(default: 0.9)",
                  "the most tokens to generate (default: 256)", "sequences decoded together (default: 1)",
                  "context length in tokens (default: the model's own)"):
        assert words in run, words
    for words in ("(default: 127.0.0.1)", "the HTTP port (default: 8080)", "sequences decoded together (default: 32)"):
        assert words in serve, words


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("ctx") / "tiny.gguf", "llama", max_position_embeddings=16384)


def test_the_context_is_the_models_own_and_max_tokens_past_it_is_refused(long_context_model):
    with EngineThread(EngineConfig(model=str(long_context_model), device="cpu", max_running=2)) as e:
        assert e.engine.max_model_len == 16384  # was capped at 4096
        with Client(e.address, ctx=e.ctx, timeout_s=60) as c:
            events = list(c.generate("hi", params=SamplingParams(max_tokens=16385)))
    assert isinstance(events[-1], Rejected) and events[-1].code == "bad_request", events[-1]
    assert "max_tokens 16385 exceeds the context of 16384 tokens" in events[-1].message


def test_http_names_max_tokens_past_the_context(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", max_position_embeddings=512)
    with running_server(model) as s:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1_000_000_000}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
        card = httpx.get(s.url + "/v1/models", timeout=30).json()["data"][0]
        assert card["sampling_defaults"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                             "repetition_penalty": 1.0, "source": "openai"}


def test_a_models_recommended_sampling_fills_unset_fields(tmp_path):
    path = write_tiny_hf(tmp_path / "hf", "qwen2")
    (path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.7, "top_p": 0.8,
                                                             "top_k": 20, "repetition_penalty": 1.05}))
    d = sampling_defaults(SimpleNamespace(format="hf", path=path))
    assert d == SamplingDefaults(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, source="model")
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}])
    p = sampling_params(req, 512, d)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    p = sampling_params(ChatRequest(messages=[{"role": "user", "content": "hi"}], temperature=0.0, top_k=0), 512, d)
    assert (p.temperature, p.top_k, p.top_p) == (0.0, 0, 0.8)  # what the request says wins
    gguf = SimpleNamespace(format="gguf", path=tmp_path,
                           gguf_metadata={"general.sampling.temp": 0.6, "general.sampling.top_k": float("nan")})
    # a value out of range is left out
    assert sampling_defaults(gguf) == SamplingDefaults(temperature=0.6, source="model")
