"""A request's affinity chain: what the prefix routing policy (gateway/router_policy.py) keys
a request on, from its token ids when it has them or the policy keys on tokens, else from its
text's bytes. Only a request's first chain_blocks blocks are read, so a long prompt costs no
more to route than a short one."""

from __future__ import annotations

import msgspec

from zinfer.gateway.router_policy import RoutePolicy, affinity_chain, text_chain
from zinfer.messages.client import Generate
from zinfer.models.prompt import PromptBuilder


def request_chain(req: Generate, p: RoutePolicy, prompts: PromptBuilder | None) -> list[int]:
    """The request's affinity chain ([] when the policy does not route by prefix). prompts:
    the replicas' tokenizer and template (None: token keys only from given ids)."""
    if p.kind != "prefix":
        return []
    if req.prompt_ids is None and p.key == "text":
        cap = p.chain_blocks * p.text_block  # bytes hashed at most: what comes after is never read
        if req.prompt is not None:
            data = req.prompt[:cap].encode("utf-8", "surrogatepass")
        elif req.messages is not None:
            parts = [msgspec.json.encode(req.tools)]
            for m in req.messages:
                if sum(map(len, parts)) >= cap:
                    break
                parts.append(msgspec.json.encode(m))
            data = b"".join(parts)
        else:
            return []
        return text_chain(data[:cap], p.text_block, p.chain_blocks)
    return affinity_chain(leading_ids(req, p, prompts), p)


def leading_ids(req: Generate, p: RoutePolicy, prompts: PromptBuilder | None) -> list[int]:
    """The prompt's leading token ids, enough for its affinity key (empty if unknown)."""
    if req.prompt_ids is not None:
        return req.prompt_ids
    if prompts is None:
        return []
    cap = p.chain_blocks * p.block_size * 16  # characters: more than the tokens of chain_blocks blocks
    try:
        if req.messages is not None and req.prompt is None:
            text = prompts.render(msgspec.to_builtins(req.messages), msgspec.to_builtins(req.tools))
            return prompts.tokenizer.encode(text[:cap], add_special=False)
        if req.prompt is not None:
            return prompts.tokenizer.encode(req.prompt[:cap], add_special=req.add_special)
    except (ValueError, TypeError, KeyError):
        pass  # the replica refuses it with the reason
    return []
