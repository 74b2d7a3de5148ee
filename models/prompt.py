"""From what a client sends (text, chat messages or token ids) to prompt token ids."""

from __future__ import annotations

from typing import Any

from zinfer.models.chat_template import ChatTemplateError, fallback_template, render_chat
from zinfer.models.loader import ModelSource
from zinfer.models.spec import ModelError
from zinfer.models.tokenizer import Tokenizer
from zinfer.models.tool_prompt import as_dicts, hermes_messages, template_handles_tools, template_tools


class PromptBuilder:
    """The model's tokenizer and chat template, behind one validating call."""

    def __init__(self, tokenizer: Tokenizer, arch: str):
        self.tokenizer = tokenizer
        self.arch = arch

    @staticmethod
    def from_source(source: ModelSource) -> "PromptBuilder":
        """The model's tokenizer and template; a vocabulary that cannot be built (corrupt
        or missing metadata, merges naming tokens the vocabulary lacks) raises ModelError."""
        try:
            if source.format == "gguf":
                tokenizer = Tokenizer.from_gguf_metadata(source.gguf_metadata)
            else:
                tokenizer = Tokenizer.from_dir(source.path)
        except ModelError:
            raise
        except Exception as exc:  # the tokenizers library raises plain Exception for a bad vocabulary
            lines = str(exc).strip().splitlines()
            first = lines[0][:200] if lines else ""
            why = f"{type(exc).__name__}: {first}"
            raise ModelError(f"{source.path.name}: its tokenizer cannot be built ({why})") from None
        if tokenizer.vocab_size > source.spec.vocab_size:
            raise ModelError(f"{source.path.name}: the tokenizer has {tokenizer.vocab_size} tokens, "
                             f"the model's embedding {source.spec.vocab_size} rows")
        return PromptBuilder(tokenizer, source.spec.arch)

    def render(self, messages: list[Any], tools: list[Any] | None = None) -> str:
        """The chat prompt text for messages (Message Structs or maps), with the generation
        prompt appended. `tools` (ToolFunctions or maps) go to a template that renders
        tools; any other template gets them, and the history's tool calls and results, as
        Hermes text in plain messages (models/tool_prompt.py)."""
        if not messages:
            raise ValueError("messages must not be empty")
        turns, listed = as_dicts(messages), template_tools(tools)
        tok = self.tokenizer
        source = tok.chat_template if tok.chat_template is not None else fallback_template(self.arch)
        if not template_handles_tools(source):
            turns, listed = hermes_messages(turns, listed), None
        try:
            return render_chat(
                source,
                turns,
                bos_token=tok.bos_token or "",
                eos_token=tok.eos_token or "",
                add_generation_prompt=True,
                architecture=self.arch,
                tools=listed,
            )
        except ChatTemplateError as exc:
            raise ValueError(f"chat template: {exc}") from None

    def tokenize(self, text: str | None, messages: list[Any] | None, add_special: bool = True,
                 tools: list[Any] | None = None) -> list[int]:
        """Token ids of text, or of messages (with tools) rendered through the chat template."""
        if messages is not None and text is None:  # the template writes BOS itself
            return self.tokenizer.encode(self.render(messages, tools), add_special=False)
        if text is not None and messages is None:
            return self.tokenizer.encode(text, add_special=add_special)
        raise ValueError("give exactly one of text or messages")

    def prompt_ids(self, prompt: str | None, messages: list[dict[str, str]] | None, prompt_ids: list[int] | None,
                   add_special: bool = True) -> list[int]:
        """The prompt of a generation from exactly one of its three forms; ValueError names what is wrong."""
        given = [x is not None for x in (prompt, messages, prompt_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of prompt, messages or prompt_ids")
        if prompt_ids is not None:
            bad = [t for t in prompt_ids if not 0 <= t < self.tokenizer.vocab_size]
            if bad:
                last = self.tokenizer.vocab_size - 1
                raise ValueError(f"prompt_ids holds ids outside the vocabulary (0..{last}): {bad[:5]}")
            ids = list(prompt_ids)
        else:
            ids = self.tokenize(prompt, messages, add_special)
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def check_params(self, logit_bias: dict[int, float], stop_token_ids: list[int]) -> None:
        """Token ids in sampling parameters must exist in the vocabulary."""
        n = self.tokenizer.vocab_size
        for name, ids in (("logit_bias", list(logit_bias)), ("stop_token_ids", stop_token_ids)):
            bad = [t for t in ids if not 0 <= t < n]
            if bad:
                raise ValueError(f"{name} holds ids outside the vocabulary (0..{n - 1}): {bad[:5]}")
