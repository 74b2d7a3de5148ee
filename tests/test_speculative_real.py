"""Speculative decoding on a real model on the default device (cpu-fast here): greedy code edits with
prompt-lookup drafts, and chat answers with a draft model's drafts (SmolLM2 drafting for itself),
give exactly the tokens plain decoding gives, and drafts are kept (slow tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from conftest import _model
from zinfer.actors.speculation import SpeculationConfig
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Delta, Finished
from zinfer.messages.params import SamplingParams

CHATS = [p["messages"] for p in json.loads((Path(__file__).parent / "benchmarks/speculative_prompts.json").read_text())]


@pytest.mark.slow
def test_code_edits_with_drafts_equal_plain_greedy_on_qwen_coder():
    config = EngineConfig(model=str(_model("qwen2.5-coder-0.5b")), max_running=2,
                          speculation=SpeculationConfig(mode="ngram"))

    async def run(engine: EngineThread) -> None:
        async with AsyncClient(engine.ctx, engine.address) as client:
            for chat in (CHATS[0], CHATS[8]):
                outputs = {}
                for mode in ("off", "ngram"):
                    ids: list[int] = []
                    async for ev in client.generate(messages=chat, params=SamplingParams(
                            temperature=0.0, max_tokens=32, speculative=mode)):
                        ids += ev.token_ids if isinstance(ev, Delta) else []
                        end = ev
                    assert isinstance(end, Finished)
                    outputs[mode] = (ids, end.usage)
                assert outputs["ngram"][0] == outputs["off"][0]
                assert outputs["ngram"][1].accepted_tokens > 10, "the edited code is mostly drafted from the prompt"

    with EngineThread(config) as engine:
        trio.run(run, engine)


CHAT = [[{"role": "user", "content": "Why is the sky blue? Answer in two sentences."}],
        [{"role": "user", "content": "List three fruits that are red."}]]


@pytest.mark.slow
def test_chat_with_a_draft_model_equals_plain_greedy_on_smollm2(smollm2_path):
    config = EngineConfig(model=str(smollm2_path), max_running=2,
                          # draft_p_min 0: the draft proposes whatever its confidence; a model drafting for
                          # itself computes what the target computes (one float order on every path), so its
                          # drafts are kept (with llama.cpp's 0.75 it proposed at 8 positions in one CI run)
                          speculation=SpeculationConfig(mode="draft", draft_model=str(smollm2_path), draft_p_min=0.0))

    async def run(engine: EngineThread) -> None:
        async with AsyncClient(engine.ctx, engine.address) as client:
            accepted = 0
            for chat in CHAT:
                outputs = {}
                for mode in ("off", "draft"):
                    ids: list[int] = []
                    async for ev in client.generate(messages=chat, params=SamplingParams(
                            temperature=0.0, max_tokens=24, speculative=mode)):
                        ids += ev.token_ids if isinstance(ev, Delta) else []
                        end = ev
                    assert isinstance(end, Finished)
                    outputs[mode] = (ids, end.usage)
                assert outputs["draft"][0] == outputs["off"][0]
                accepted += outputs["draft"][1].accepted_tokens
            assert accepted > 10, "a model drafting for itself is mostly right"

    with EngineThread(config) as engine:
        trio.run(run, engine)
