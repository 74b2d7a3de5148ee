"""Rendering chat messages into a prompt with the model's jinja chat template.

Rendering follows transformers' `apply_chat_template`: an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loop controls, a `tojson` filter that does not
HTML-escape, and the globals `raise_exception` and `strftime_now`. The template sees
`messages`, `bos_token`, `eos_token`, `add_generation_prompt` and `tools` (None).

A model without a template gets a fallback chosen from what the caller knows: the
Gemma turn format for Gemma (by architecture, or by <start_of_turn> in the vocab),
else ChatML.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Collection

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The chat template failed to compile or render (the message says why)."""


GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '')"
    " + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def fallback_template(architecture: str | None = None,
                      special_tokens: Collection[str] = ()) -> str:
    """The template to use when the model ships none: Gemma turns for Gemma models
    (architecture name starting with "gemma" or "<start_of_turn>" among the tokens),
    ChatML otherwise."""
    if (architecture or "").lower().startswith("gemma") or "<start_of_turn>" in special_tokens:
        return GEMMA_TEMPLATE
    return CHATML_TEMPLATE


def render_chat(template: str | None, messages: list[dict[str, Any]], *,
                bos_token: str = "", eos_token: str = "", add_generation_prompt: bool = True,
                architecture: str | None = None, special_tokens: Collection[str] = (),
                tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]).

    `template` None picks `fallback_template(architecture, special_tokens)`. The text
    may begin with `bos_token` when the template writes it: encode such a prompt
    without adding another BOS. Raises ChatTemplateError on any template failure."""
    source = template if template is not None else fallback_template(architecture, special_tokens)
    try:
        compiled = _compile(source)
        return compiled.render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt, tools=tools)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e}") from e
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise ChatTemplateError(f"chat template failed on these messages: {e!r}") from e


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the messages: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)
