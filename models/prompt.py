"""From what a client sends (text, chat messages or token ids) to prompt token ids."""

from __future__ import annotations

from zinfer.models.chat_template import ChatTemplateError, render_chat
from zinfer.models.loader import ModelSource
from zinfer.models.tokenizer import Tokenizer


class PromptBuilder:
    """The model's tokenizer and chat template, behind one validating call."""

    def __init__(self, tokenizer: Tokenizer, arch: str):
        self.tokenizer = tokenizer
        self.arch = arch

    @staticmethod
    def from_source(source: ModelSource) -> "PromptBuilder":
        if source.format == "gguf":
            return PromptBuilder(Tokenizer.from_gguf_metadata(source.gguf_metadata), source.spec.arch)
        return PromptBuilder(Tokenizer.from_dir(source.path), source.spec.arch)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The chat prompt text for messages, with the generation prompt appended."""
        if not messages:
            raise ValueError("messages must not be empty")
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError("each message needs a role and a content")
        tok = self.tokenizer
        try:
            return render_chat(
                tok.chat_template,
                messages,
                bos_token=tok.bos_token or "",
                eos_token=tok.eos_token or "",
                add_generation_prompt=True,
                architecture=self.arch,
            )
        except ChatTemplateError as exc:
            raise ValueError(f"chat template: {exc}") from None

    def tokenize(self, text: str | None, messages: list[dict[str, str]] | None, add_special: bool = True) -> list[int]:
        """Token ids of text, or of messages rendered through the chat template."""
        if (text is None) == (messages is None):
            raise ValueError("give exactly one of text or messages")
        if messages is not None:
            return self.tokenizer.encode(self.render(messages), add_special=False)  # the template writes BOS itself
        return self.tokenizer.encode(text, add_special=add_special)

    def prompt_ids(self, prompt: str | None, messages: list[dict[str, str]] | None, prompt_ids: list[int] | None, add_special: bool = True) -> list[int]:
        """The prompt of a generation from exactly one of its three forms; ValueError names what is wrong."""
        given = [x is not None for x in (prompt, messages, prompt_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of prompt, messages or prompt_ids")
        if prompt_ids is not None:
            bad = [t for t in prompt_ids if not 0 <= t < self.tokenizer.vocab_size]
            if bad:
                raise ValueError(f"prompt_ids holds ids outside the vocabulary (0..{self.tokenizer.vocab_size - 1}): {bad[:5]}")
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
