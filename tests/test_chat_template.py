"""Chat templates: SmolLM2's real template, the Gemma fallback, template errors."""

from __future__ import annotations

import pytest

from zinfer.models.chat_template import ChatTemplateError, fallback_template, render_chat
from zinfer.models.gguf_vocab import read_tokenizer_metadata

CONVERSATION = [
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello, how can I help?"},
    {"role": "user", "content": "Name a color."},
]


@pytest.fixture(scope="module")
def smollm2_template(smollm2_path):
    return read_tokenizer_metadata(str(smollm2_path))["tokenizer.chat_template"]


@pytest.mark.slow
def test_smollm2_template_renders_chatml_with_default_system(smollm2_template):
    text = render_chat(smollm2_template, CONVERSATION, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello, how can I help?<|im_end|>\n"
        "<|im_start|>user\nName a color.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.slow
def test_smollm2_template_keeps_given_system_and_no_generation_prompt(smollm2_template):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = render_chat(smollm2_template, msgs, add_generation_prompt=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_gemma_fallback_turn_format():
    text = render_chat(None, CONVERSATION, bos_token="<bos>", eos_token="<eos>", architecture="gemma3")
    assert text == (
        "<bos><start_of_turn>user\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello, how can I help?<end_of_turn>\n"
        "<start_of_turn>user\nName a color.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_fallback_folds_system_into_first_user_turn():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = render_chat(None, msgs, special_tokens={"<start_of_turn>", "<end_of_turn>"})
    assert text == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_chatml_fallback_for_other_models():
    assert fallback_template("llama") == fallback_template(None)
    text = render_chat(None, CONVERSATION[:1], architecture="llama")
    assert text == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"


def test_raise_exception_gives_chat_template_error():
    tmpl = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        render_chat(tmpl, [{"role": "assistant", "content": "x"}])
    assert render_chat(tmpl, [{"role": "user", "content": "x"}]) == "ok"


def test_broken_template_gives_chat_template_error():
    with pytest.raises(ChatTemplateError):
        render_chat("{% for m in messages %}{{ m.content ", CONVERSATION)


def test_tojson_does_not_escape_and_sandbox_blocks_mutation():
    assert render_chat("{{ messages[0] | tojson }}", [{"role": "user", "content": "<a&b>"}]) == \
        '{"role": "user", "content": "<a&b>"}'
    with pytest.raises(ChatTemplateError):
        render_chat("{% set _ = messages.append(1) %}", CONVERSATION)
