"""The tokenizer against llama.cpp's token ids (committed goldens) on the real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zinfer.models.gguf_vocab import read_tokenizer_metadata, tokenizer_json_from_gguf
from zinfer.models.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # every test here loads a real model

GOLDENS = Path(__file__).parent / "goldens"


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_path):
    return read_tokenizer_metadata(str(smollm2_path))


@pytest.fixture(scope="module")
def gemma3_meta(gemma3_path):
    return read_tokenizer_metadata(str(gemma3_path))


@pytest.fixture(scope="module")
def smollm2(smollm2_meta):
    return Tokenizer.from_gguf_metadata(smollm2_meta)


@pytest.fixture(scope="module")
def gemma3(gemma3_meta):
    return Tokenizer.from_gguf_metadata(gemma3_meta)


def _golden_cases(name):
    return json.loads((GOLDENS / f"tokens_{name}.json").read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", _golden_cases("smollm2-135m"), ids=lambda c: repr(c["text"])[:40])
def test_smollm2_encode_matches_llama_cpp(smollm2, case):
    assert smollm2.encode(case["text"]) == case["ids"]


@pytest.mark.parametrize("case", _golden_cases("gemma3-270m"), ids=lambda c: repr(c["text"])[:40])
def test_gemma3_encode_matches_llama_cpp(gemma3, case):
    assert gemma3.encode(case["text"]) == case["ids"]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_decode_round_trips_golden_texts(name, request):
    tok = request.getfixturevalue("smollm2" if name.startswith("smollm2") else "gemma3")
    for case in _golden_cases(name):
        # special tokens kept: every text comes back byte for byte
        assert tok.decode(tok.encode(case["text"], add_special=False), skip_special=False) == case["text"]


def test_special_ids_and_flags(smollm2, gemma3):
    assert (smollm2.bos_id, smollm2.add_bos) == (1, False)
    assert smollm2.token_to_id("<|im_end|>") in smollm2.eos_ids
    assert smollm2.eos_id == smollm2.token_to_id("<|im_end|>")
    assert smollm2.chat_template is not None and "<|im_start|>" in smollm2.chat_template
    assert (gemma3.bos_id, gemma3.add_bos, gemma3.bos_token) == (2, True, "<bos>")
    assert {gemma3.token_to_id("<eos>"), gemma3.token_to_id("<end_of_turn>")} <= gemma3.eos_ids
    assert gemma3.chat_template is None
    assert gemma3.vocab_size == 262144 and smollm2.vocab_size == 49152


def test_special_text_parses_to_one_id_and_decode_skips_it(smollm2, gemma3):
    ids = smollm2.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == smollm2.token_to_id("<|im_start|>") and ids[-1] == smollm2.token_to_id("<|im_end|>")
    assert smollm2.decode(ids) == "user\nHi"
    assert smollm2.decode(ids, skip_special=False) == "<|im_start|>user\nHi<|im_end|>"
    g = gemma3.encode("<start_of_turn>model\n", add_special=False)
    assert g[0] == gemma3.token_to_id("<start_of_turn>")
    assert gemma3.encode("x")[0] == gemma3.bos_id and gemma3.encode("x", add_special=False)[0] != gemma3.bos_id


def test_byte_fallback_tokens_give_raw_bytes(gemma3):
    e4 = gemma3.token_to_id("<0xE4>")
    assert gemma3.token_bytes(e4) == b"\xe4"
    assert gemma3.decode([e4, gemma3.token_to_id("<0xB8>"), gemma3.token_to_id("<0xAD>")]) == "中"


def test_tokenizer_json_round_trip(tmp_path, smollm2_meta):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json_from_gguf(smollm2_meta), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": smollm2_meta["tokenizer.chat_template"]}), encoding="utf-8")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = Tokenizer.from_dir(tmp_path)
    for case in _golden_cases("smollm2-135m"):
        assert tok.encode(case["text"]) == case["ids"]
    assert tok.eos_ids == {0, 2} and tok.bos_id == 1 and not tok.add_bos
    assert tok.chat_template == smollm2_meta["tokenizer.chat_template"]


def test_from_dir_reads_bos_from_post_processor(tmp_path, gemma3_meta):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json_from_gguf(gemma3_meta), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.add_bos and tok.encode("Hello world")[0] == 2
    for case in _golden_cases("gemma3-270m"):
        assert tok.encode(case["text"]) == case["ids"]
