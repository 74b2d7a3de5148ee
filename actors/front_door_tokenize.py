"""The front door's answers to Tokenize and Detokenize requests (actors/front_door_actor.py):
encoding runs on the prompt-encoding worker (off the event loop when large), and whatever goes
wrong ends that request alone, with a Rejected (bad input) or Failed (a tokenizer bug)."""

from __future__ import annotations

import structlog

from zinfer.actors.prompt_encoding import EncodingWorker, PromptLimits, PromptTooLong, encode_text_or_chat, input_size
from zinfer.messages.client import ClientEvent, Detokenize, Failed, Rejected, Tokenize, TokenizeResult
from zinfer.models.prompt import PromptBuilder

log = structlog.get_logger("zinfer.front_door")


async def tokenize_reply(worker: EncodingWorker, prompts: PromptBuilder, limits: PromptLimits, max_model_len: int,
                         req: Tokenize) -> ClientEvent:
    """The ids of req's text or chat (TokenizeResult), or why not."""
    try:
        ids = await worker.run(input_size(req), encode_text_or_chat, prompts, limits, req.text, req.messages,
                               req.add_special, req.tools)
    except PromptTooLong as exc:
        return Rejected(req.request_id, "too_long", str(exc), n_ctx=max_model_len)
    except ValueError as exc:
        return Rejected(req.request_id, "bad_request", str(exc))
    except Exception as exc:  # a tokenizer bug fails this request only
        log.exception("tokenizing failed", request_id=req.request_id)
        return Failed(req.request_id, f"cannot tokenize: {exc!r}")
    return TokenizeResult(req.request_id, ids)


async def detokenize_reply(worker: EncodingWorker, prompts: PromptBuilder, req: Detokenize) -> ClientEvent:
    """The text of req's ids (TokenizeResult), or Rejected naming why they have none."""
    try:
        text = await worker.run(len(req.token_ids), prompts.tokenizer.decode, req.token_ids)
    except Exception as exc:  # the tokenizers library raises its own types on bad ids
        return Rejected(req.request_id, "bad_request", f"cannot detokenize: {exc}")
    return TokenizeResult(req.request_id, req.token_ids, text)
