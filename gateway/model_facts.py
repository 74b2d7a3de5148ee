"""What the protocol routes say about the served model (llama-server's /props, Ollama's
/api/tags and /api/show) and need from its vocabulary (FIM tokens, token pieces, the chat
template rendered as the engine renders it), read once when the model is loaded.

The gateway keeps its own PromptBuilder for this: the same class and template code the
engine's front door renders and encodes with, so /apply-template shows the very text a
chat request is encoded from. Generation still goes through the engine alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zinfer.models.fim_tokens import FimTokens, fim_tokens
from zinfer.models.loader import ModelSource
from zinfer.models.prompt import PromptBuilder
from zinfer.models.tool_prompt import source_chat_template


@dataclass(frozen=True)
class ModelFacts:
    path: str
    name: str  # general.name, or the file's name
    size_bytes: int  # the file (or the folder's files) on disk
    arch: str
    quant: str  # the most common tensor type, e.g. "Q5_0"
    n_params: int
    context_length: int  # what the model was trained for (the server's may be smaller)
    chat_template: str | None
    prompts: PromptBuilder
    fim: FimTokens | None  # None: the model cannot infill

    @staticmethod
    def from_source(source: ModelSource) -> "ModelFacts":
        prompts = PromptBuilder.from_source(source)
        files = [source.path] if source.path.is_file() else [p for p in source.path.iterdir() if p.is_file()]
        counts = source.quant_types
        return ModelFacts(
            path=str(source.path),
            name=source.name,
            size_bytes=sum(p.stat().st_size for p in files),
            arch=source.spec.arch,
            quant=max(counts, key=lambda k: counts[k]) if counts else "",
            n_params=source.n_params,
            context_length=source.spec.context_length,
            chat_template=source_chat_template(source),
            prompts=prompts,
            fim=fim_tokens(prompts.tokenizer.token_to_id, source.gguf_metadata),
        )

    @property
    def parameter_size(self) -> str:
        """The parameter count as Ollama writes it: '494.03M', '1.54B'."""
        n = self.n_params
        return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"

    def piece(self, token_id: int) -> str | list[int]:
        """A token's text, or its bytes where they are not whole UTF-8 (llama-server's with_pieces)."""
        raw = self.prompts.tokenizer.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    def render(self, messages: list[Any], tools: list[Any] | None = None) -> str:
        """The chat prompt text of messages, as the engine renders it; ValueError names a problem."""
        return self.prompts.render(messages, tools)
