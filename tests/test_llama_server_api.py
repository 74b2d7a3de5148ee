"""llama-server's native API (`/completion`, `/infill`, `/tokenize` with pieces, `/apply-template`,
`/props`, `/slots`, the unprefixed OpenAI aliases, X-Api-Key) of a real `zinfer serve`
over raw HTTP, as llama.vim and llama.vscode talk to it, on a tiny random model whose GGUF
names FIM tokens (the infill prompt is laid out as llama-server lays it out; a model
without them is refused in test_ollama_api.py). Real-model answers are in
test_llama_server_protocols_real.py."""

from __future__ import annotations

import json

import httpx
import pytest
from http_server import running_server, sse_events
from tiny import write_tiny_gguf

KEY = "sk-llama"
H = {"X-Api-Key": KEY}
FIELDS = {"content", "tokens", "stop", "stop_type", "stopping_word", "truncated", "timings", "generation_settings",
          "tokens_predicted", "tokens_evaluated", "tokens_cached", "prompt", "model", "id_slot", "has_new_line"}
TIMINGS = {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second",
           "cache_n"}
FIM = {"pre": "P", "suf": "S", "mid": "M", "rep": "R", "sep": "F"}
"""The tiny FIM model's markers: the byte tokens of these letters (tiny.py: byte b is token 2 + b)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    meta = {f"tokenizer.ggml.fim_{k}_token_id": 2 + ord(v) for k, v in FIM.items()}
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", "llama", max_position_embeddings=2048,
                            metadata=meta)
    with running_server(model, api_key=KEY) as s:
        yield s


def post(server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=H, timeout=120, **kw)


def completion(server, **body) -> dict:
    r = post(server, "/completion", {"temperature": 0, "n_predict": 4, **body})
    assert r.status_code == 200, r.text
    return r.json()


def error(r: httpx.Response, status: int = 400) -> str:
    assert r.status_code == status and set(r.json()) == {"error"}, r.text
    assert r.json()["error"]["code"] == status and r.json()["error"]["type"]
    return r.json()["error"]["message"]


def test_completion_answers_llama_servers_fields(server):
    r = completion(server, prompt="the cat", n_probs=2, return_tokens=True)
    assert FIELDS <= set(r) and TIMINGS <= set(r["timings"]) and r["stop"] is True
    assert r["stop_type"] == "limit" and r["truncated"] is False and r["tokens_predicted"] == 4
    assert len(r["tokens"]) == 4 and r["prompt"] == "the cat"
    assert r["generation_settings"]["n_predict"] == 4 and r["generation_settings"]["temperature"] == 0
    probs = r["completion_probabilities"]
    assert [p["id"] for p in probs] == r["tokens"] and all(len(p["top_logprobs"]) == 2 for p in probs)
    assert all(p["top_logprobs"][0]["logprob"] >= p["top_logprobs"][1]["logprob"] for p in probs)
    assert all(p["logprob"] == p["top_logprobs"][0]["logprob"] for p in probs)  # greedy: the likeliest


def test_response_fields_pick_a_whole_answers_fields_by_path(server):
    # llama.vim's request asks for these
    r = completion(server, prompt="the cat", response_fields=["content", "timings/predicted_n", "truncated", "nope"])
    assert set(r) == {"content", "timings/predicted_n", "truncated"} and r["timings/predicted_n"] == 4


def test_id_and_mixed_prompts_match_the_text_prompt(server):
    ids = post(server, "/tokenize", {"content": "the cat"}).json()["tokens"]
    text = completion(server, prompt="the cat", return_tokens=True)
    assert completion(server, prompt=ids, return_tokens=True)["tokens"] == text["tokens"]
    half = post(server, "/tokenize", {"content": "the", "add_special": True}).json()["tokens"]
    assert completion(server, prompt=[*half, " cat"], return_tokens=True)["tokens"] == text["tokens"]


def test_stream_chunks_add_up_to_the_whole_result(server):
    whole = completion(server, prompt="the cat", n_predict=6)
    with httpx.stream("POST", server.url + "/completion", headers=H, timeout=120,
                      json={"prompt": "the cat", "n_predict": 6, "temperature": 0, "stream": True}) as s:
        chunks = [json.loads(e) for e in sse_events(s.iter_lines())]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert FIELDS <= set(chunks[-1]) and chunks[-1]["tokens_predicted"] == 6


def test_json_schema_and_grammar_constrain_the_content(server):
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"],
              "additionalProperties": False}
    r = completion(server, prompt="the cat", json_schema=schema, n_predict=20)
    assert json.loads(r["content"])["a"] in ("x", "y") and r["stop_type"] == "eos"
    yes_no = completion(server, prompt="the cat", grammar='root ::= "yes" | "no"', n_predict=5)
    assert yes_no["content"] in ("yes", "no")


def test_tokenize_pieces_template_props_slots_and_aliases(server):
    pieces = post(server, "/tokenize", {"content": "the cat", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces[1:]) == "the cat" and pieces[0]["piece"] == "<|bos|>"
    assert post(server, "/detokenize", {"tokens": [p["id"] for p in pieces]}).json()["content"] == "the cat"
    prompt = post(server, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
    assert prompt.endswith("user\nhi<|im_end|>\n<|im_start|>assistant\n")
    props = httpx.get(server.url + "/props", headers=H).json()
    assert props["default_generation_settings"]["n_ctx"] == 2048 and props["total_slots"] >= 1
    assert props["infill"] is True and props["bos_token"] == "<|bos|>"
    slots = httpx.get(server.url + "/slots", headers=H).json()
    assert len(slots) == props["total_slots"] and not any(s["is_processing"] for s in slots)
    # ignore_eos: random weights may end the answer at once
    hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "ignore_eos": True}
    chat = post(server, "/chat/completions", hi)
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 2 and "timings" not in chat.json()
    timed = post(server, "/chat/completions", {**hi, "timings_per_token": True}).json()["timings"]
    assert TIMINGS <= set(timed) and timed["predicted_n"] == 2
    with httpx.stream("POST", server.url + "/v1/completions", headers=H, timeout=120,
                      json={"prompt": "hi", "max_tokens": 2, "stream": True, "timings_per_token": True,
                            "ignore_eos": True}) as s:
        events = list(sse_events(s.iter_lines()))
    assert events[-1] == "[DONE]" and json.loads(events[-2])["timings"]["predicted_n"] == 2
    assert httpx.get(server.url + "/models", headers=H).json()["data"][0]["id"] == server.model
    assert httpx.get(server.url + "/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_bad_requests_get_llama_servers_errors_and_the_server_serves_on(server):
    assert "mirostat" in error(post(server, "/completion", {"prompt": "x", "mirostat": 2}))
    assert "temperature" in error(post(server, "/completion", {"prompt": "x", "temperature": "hot"}))
    assert "samplers" in error(post(server, "/completion", {"prompt": "x", "samplers": ["top_p", "temperature"],
                                                            "temperature": 0.5, "top_p": 0.9}))
    assert "infill" in error(post(server, "/completion", {"prompt": "x", "samplers": ["top_k", "infill"]}))
    assert "prompt" in error(post(server, "/completion", {"prompt": ["a", ["b"]]}))
    assert "prompt" in error(post(server, "/completion", {"prompt": [-1]}))
    assert "n_predict" in error(post(server, "/completion", {"prompt": "x", "n_predict": -5}))
    assert "logit_bias" in error(post(server, "/completion", {"prompt": "x", "logit_bias": [[1, {"a": 1}]]}))
    assert "stop_at_suffix" in error(post(server, "/completion", {"prompt": "x", "stop_at_suffix": True}))
    assert "n_indent" in error(post(server, "/infill", {"input_prefix": "x", "n_indent": -1}))
    [first] = completion(server, prompt="the cat", return_tokens=True, n_predict=1)["tokens"]
    banned = completion(server, prompt="the cat", return_tokens=True, n_predict=1, logit_bias=[[first, False]])
    assert banned["tokens"] != [first]  # false bans the token
    refused = post(server, "/tokenize", {"content": "x", "parse_special": False})  # OpenAI's shape, as before
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "parse_special"
    assert "input_extra" in error(post(server, "/infill", {"input_prefix": "a", "input_extra": [{"name": "x"}]}))
    assert "API key" in error(httpx.post(server.url + "/completion", json={"prompt": "x"}), 401)
    too_long = post(server, "/completion", {"prompt": "the cat " * 2000})
    assert "2048 tokens" in error(too_long)
    assert completion(server, prompt="the cat")["tokens_predicted"] == 4


def test_infill_lays_out_the_models_fim_tokens(server):
    extra = [{"filename": "util.py", "text": "X = 1\n", "time": [1, 2]}]  # llama.vim's chunks have a time
    r = post(server, "/infill", {"input_prefix": "def f(", "input_suffix": "):\n", "input_extra": extra, "prompt": "a",
                                 "n_predict": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == "Rmyproject\nFutil.py\nX = 1\nFfilename\nPdef f(aS):\nM"
    assert r.json()["tokens_predicted"] == 3 and FIELDS <= set(r.json())
    plain = post(server, "/infill", {"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 1})
    assert plain.json()["prompt"] == "Pdef f(S):\nM"  # no extra files: no repo and file names
    assert plain.json()["generation_settings"]["stop_at_suffix"] is True
