"""Chat messages with tools, shaped for a chat template.

A template that mentions `tools` (Qwen2.5's, Llama 3.1's, Hermes') renders them itself:
it gets `tools` as [{"type": "function", "function": {...}}] and the history's tool calls
with their arguments parsed into a mapping, as transformers' templates expect.

A template without tool support (SmolLM2's, the ChatML and Gemma fallbacks) gets the
Hermes format written into plain messages instead:
- the tools, listed as JSON inside <tools></tools> in the system message (added first
  when the chat has none), with the instruction to answer with
  <tool_call>{"name": ..., "arguments": {...}}</tool_call>;
- an assistant message's tool calls as those <tool_call> blocks after its text;
- each run of "tool" messages as one "user" message of <tool_response> blocks.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from zinfer.models.loader import ModelSource
from zinfer.models.tokenizer import chat_template_from, read_json_object

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_INSTRUCTION = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def template_handles_tools(source: str) -> bool:
    """Whether a chat template's source renders tools itself (it names `tools`)."""
    return "tools" in source


def as_dicts(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages (messages/client.py Message Structs, or maps) as plain dicts, content None
    written "" and each tool call's JSON arguments parsed (kept as text when not an object).
    ValueError when a message lacks a role, or lacks both content and tool calls."""
    out = []
    for m in messages:
        d = msgspec.to_builtins(m)
        if not isinstance(d, dict) or "role" not in d or (d.get("content") is None and not d.get("tool_calls")):
            raise ValueError("each message needs a role and a content")
        d["content"] = d.get("content") or ""
        if d.get("tool_calls"):
            d["tool_calls"] = [_parsed_arguments(c) for c in d["tool_calls"]]
        out.append(d)
    return out


def _parsed_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    try:
        args = json.loads(fn.get("arguments", ""))
    except (TypeError, ValueError):
        args = None
    if isinstance(args, dict):
        fn["arguments"] = args
    return {**call, "type": "function", "function": fn}


def template_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Tool functions (ToolFunction Structs or maps) as templates take them; None for none."""
    if not tools:
        return None
    return [{"type": "function", "function": msgspec.to_builtins(t)} for t in tools]


def hermes_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """Messages (as_dicts) with tools, tool calls and tool results written as Hermes text,
    for a template that knows only role and content. `tools` as template_tools gives them."""
    out: list[dict[str, str]] = []
    gathering = False  # out[-1] is the user message that gathers a run of tool results
    for m in messages:
        if m["role"] == "tool":
            response = f"<tool_response>\n{m['content']}\n</tool_response>"
            if gathering:
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
            gathering = True
            continue
        if m.get("tool_calls"):
            fns = [c["function"] for c in m["tool_calls"]]
            calls = "\n".join(call_text(fn["name"], fn.get("arguments", {})) for fn in fns)
            out.append({"role": m["role"], "content": (m["content"] + "\n" if m["content"] else "") + calls})
        else:
            out.append({"role": m["role"], "content": m["content"]})
        gathering = False
    if tools:
        listing = TOOLS_PREAMBLE + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_INSTRUCTION
        if out and out[0]["role"] == "system":
            out[0]["content"] = out[0]["content"] + "\n\n" + listing
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def call_text(name: str, arguments: Any) -> str:
    """One Hermes tool call block: arguments a mapping (or a text kept as it came)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def call_syntax(template: str | None) -> str:
    """How a model writes a call, by its chat template: "llama3" for Llama 3.1's
    {"name": ..., "parameters": {...}} (its template speaks of <|python_tag|> or
    "parameters" and not of <tool_call>), else "hermes" (Qwen's, Hermes', zinfer's fallback)."""
    if template and "<tool_call>" not in template and ("<|python_tag|>" in template or '"parameters"' in template):
        return "llama3"
    return "hermes"


def source_chat_template(source: ModelSource) -> str | None:
    """The chat template a model ships: GGUF metadata, or an HF folder's
    tokenizer_config.json or chat_template.jinja (as Tokenizer.from_dir reads them)."""
    if source.format == "gguf":
        shipped: str | None = source.gguf_metadata.get("tokenizer.chat_template")
        return shipped
    template = chat_template_from(read_json_object(source.path / "tokenizer_config.json").get("chat_template"))
    jinja = source.path / "chat_template.jinja"
    return template if template is not None or not jinja.exists() else jinja.read_text(encoding="utf-8")
