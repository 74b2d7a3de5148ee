"""The token ids of a fill-in-the-middle prompt, laid out as llama-server's /infill lays them
out (prefix-suffix-middle), from the model's own FIM tokens (models/fim_tokens.py):

    [<|repo_name|> "myproject\\n" (<|file_sep|> "NAME\\n" TEXT)* <|file_sep|> "filename\\n"]
    [BOS] <|fim_prefix|> PREFIX PROMPT <|fim_suffix|> SUFFIX <|fim_middle|>

The bracketed head comes only with extra files (input_extra), and its repo and file
separator tokens only where the model has them; extra files without a file separator
token are set off by a "--- snippet ---" line as llama-server does. llama-server writes
the head for every request; without extra files it holds only placeholder names, and
measured on Qwen2.5-Coder it makes the middle run on past the hole (1.5B: after "a + b"
it went on to write more functions, where the plain prompt stopped; 0.5B: fewer holes
filled), so it is left out. Texts are encoded by the engine without special tokens added.
Unlike llama-server, nothing is cut to fit a batch: a prompt longer than the context is
refused as any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from zinfer.gateway.client import EngineClient
from zinfer.gateway.model_facts import ModelFacts
from zinfer.gateway.openai_schema import ApiError
from zinfer.gateway.state import GatewayState

SNIPPET = "\n\n--- snippet ---\n\n"
REPO = "myproject\n"  # llama-server's project name
CURRENT_FILE = "filename\n"  # and its name for the file being edited


@dataclass(frozen=True)
class ExtraFile:
    filename: str
    text: str


def facts(state: GatewayState) -> ModelFacts:
    """The served model's facts (gateway/model_facts.py); ApiError 503 while it loads."""
    state.engine()
    found = state.extra.get("model")
    if not isinstance(found, ModelFacts):
        raise ApiError(503, "the model's facts are not read yet", type="unavailable_error", code="loading")
    return found


async def infill_ids(
    state: GatewayState,
    prefix: str,
    suffix: str,
    extra: tuple[ExtraFile, ...] = (),
    prompt: str = "",
    param: str = "input_prefix",
) -> list[int]:
    """The FIM prompt's ids; ApiError 400 naming `param` when the model has no FIM tokens."""
    fim = facts(state).fim
    if fim is None:
        raise ApiError(400, "this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
                       "<|fim_middle|> or the like) in its vocabulary, so it cannot infill", param=param,
                       code="infill_not_supported")
    client = state.engine()

    async def ids(text: str) -> list[int]:
        return await client.tokenize(text, add_special=False) if text else []

    head: list[int] = []
    if extra and fim.repo is not None:
        head += [fim.repo, *await ids(REPO)]
    for f in extra:
        head += [fim.sep, *await ids(f.filename + "\n")] if fim.sep is not None else await ids(SNIPPET)
        head += await ids(f.text)
    if extra and fim.sep is not None:
        head += [fim.sep, *await ids(CURRENT_FILE)]
    bos = await _bos(client)
    return [*head, *bos, fim.prefix, *await ids(prefix), *await ids(prompt), fim.suffix, *await ids(suffix),
            fim.middle]


async def _bos(client: EngineClient) -> list[int]:
    """[BOS] where the model adds one to a text, else []: the ids of "" with special tokens added."""
    return await client.tokenize("", add_special=True)
