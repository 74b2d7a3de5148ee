"""Structured output on the OpenAI routes: the request fields that ask for it, turned into
one checked Constraint (messages/params.py) before any work is queued.

Taken the way each server takes them:
- OpenAI: response_format {"type": "text"} (no constraint), {"type": "json_object"}, or
  {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; llama-server's
  {"type": "json_object", "schema": {...}} too.
- vLLM: guided_json (a schema object or its JSON text), guided_regex, guided_choice (a
  list of strings), guided_grammar (Lark or GBNF), and the newer structured_outputs with
  one of json, regex, choice, grammar (or json_object: true).
- llama-server: json_schema (a schema object) and grammar (GBNF, converted to llguidance's
  Lark dialect by llguidance).

At most one of them per request. Every problem is an ApiError 400 naming the field in
`param`: here the fields' shapes and sizes; the grammar itself is measured and compiled
with the model's vocabulary at the engine's front door (actors/grammar_checker.py), whose
refusal (code "bad_constraint") the shaper answers as a 400 naming the same field
(constraint_field). No grammar library runs in the gateway.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from llguidance.gbnf_to_lark import is_lark_syntax

from zinfer.gateway.openai_schema import ApiError
from zinfer.messages.json_schema import map_schemas
from zinfer.messages.params import MAX_CONSTRAINT_BYTES, Constraint

ANY_OBJECT = '{"type": "object"}'
FIELDS = (
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
    "json_schema", "grammar",
)
"""The request fields that ask for a constraint, in the order they are looked at."""
STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def constraint_from_request(req: Any) -> Constraint | None:
    """The one checked Constraint that req (any object with some of FIELDS as attributes,
    None when not given) asks for, or None; ApiError 400 with param on a bad or second one."""
    found: list[tuple[str, Constraint]] = []
    for name in FIELDS:
        value = getattr(req, name, None)
        if value is None:
            continue
        c = _FIELD_READERS[name](value, name)
        if c is not None:
            found.append((name, c))
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise ApiError(400, f"at most one structured-output constraint per request, got {names}",
                       param=found[1][0], code="invalid_value")
    if not found:
        return None
    name, c = found[0]
    return checked(c, name)


def constraint_field(req: Any) -> str | None:
    """The field of req that asked for a constraint (as constraint_from_request read it)."""
    return next((name for name in FIELDS if getattr(req, name, None) is not None), None)


def checked(c: Constraint, param: str) -> Constraint:
    """c, if its spec is within the size limit; else ApiError 400 naming param."""
    if len(c.spec.encode("utf-8", "surrogatepass")) > MAX_CONSTRAINT_BYTES:
        raise ApiError(400, f"{param} is larger than {MAX_CONSTRAINT_BYTES >> 10} KiB",
                       param=param, code="invalid_value")
    return c


def response_format_constraint(fmt: Any, param: str = "response_format") -> Constraint | None:
    """OpenAI's response_format (chat's nested json_schema, or the flat form of the
    Responses API's text.format: {"type": "json_schema", "name", "schema", "strict"})."""
    if not isinstance(fmt, Mapping):
        raise ApiError(400, f"{param} must be an object with a type", param=param, code="invalid_value")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema")  # llama-server's extension
        return Constraint("json_schema", ANY_OBJECT if schema is None else _schema_text(schema, param))
    if kind == "json_schema":
        inner = fmt.get("json_schema", fmt)
        if not isinstance(inner, Mapping):
            raise ApiError(400, f"{param}.json_schema must be an object with name and schema",
                           param=param, code="invalid_value")
        if "name" in inner and not isinstance(inner["name"], str):
            raise ApiError(400, f"{param}.json_schema.name must be a string", param=param, code="invalid_value")
        schema = inner.get("schema")
        if inner.get("strict") is True and isinstance(schema, Mapping):
            schema = closed_objects(schema)
        return Constraint("json_schema", ANY_OBJECT if schema is None else _schema_text(schema, param))
    raise ApiError(400, f"{param}.type must be one of text, json_object, json_schema; got {_short(kind)}",
                   param=param, code="invalid_value")


def closed_objects(schema: Any) -> Any:
    """schema with `additionalProperties: false` on every object schema that does not say,
    as OpenAI's strict mode reads it (its clients send strict: true; a pydantic schema leaves
    objects open, and a small model then invents keys until max_tokens). A copy."""
    return map_schemas(schema, _closed)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    return schema


def _schema_text(schema: Any, param: str, text_ok: bool = False) -> str:
    """A JSON schema (an object, or with text_ok its JSON text) as JSON text."""
    if text_ok and isinstance(schema, str):
        return schema
    if not isinstance(schema, (Mapping, bool)):
        raise ApiError(400, f"{param} must hold a JSON schema object, got {type(schema).__name__}",
                       param=param, code="invalid_value")
    return json.dumps(schema)


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{param} must be a non-empty string", param=param, code="invalid_value")
    return value


def _choices(value: Any, param: str) -> Constraint:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise ApiError(400, f"{param} must be a non-empty list of non-empty strings", param=param, code="invalid_value")
    return Constraint("choice", json.dumps(value))


def _grammar(value: Any, param: str) -> Constraint:
    """A Lark or GBNF grammar, told apart as llguidance tells them (the engine converts GBNF)."""
    text = _string(value, param)
    return Constraint("lark" if is_lark_syntax(text) else "gbnf", text)


def _structured_outputs(value: Any, param: str) -> Constraint | None:
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object."""
    if not isinstance(value, Mapping):
        raise ApiError(400, f"{param} must be an object", param=param, code="invalid_value")
    unknown = [k for k in value if k not in STRUCTURED_OUTPUTS_KEYS]
    if unknown:
        raise ApiError(400,
                       f"{param} takes {', '.join(STRUCTURED_OUTPUTS_KEYS)}; {_short(unknown[0])} is not supported",
                       param=param, code="invalid_value")
    given = [k for k in STRUCTURED_OUTPUTS_KEYS if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise ApiError(400, f"{param} takes one of {', '.join(STRUCTURED_OUTPUTS_KEYS)}, got {', '.join(given)}",
                       param=param, code="invalid_value")
    if not given:
        return None
    key = given[0]
    sub = f"{param}.{key}"
    if key == "json_object":
        return Constraint("json_schema", ANY_OBJECT)
    if key == "json":
        return Constraint("json_schema", _schema_text(value[key], sub, text_ok=True))
    if key == "regex":
        return Constraint("regex", _string(value[key], sub))
    if key == "choice":
        return _choices(value[key], sub)
    return _grammar(value[key], sub)


_FIELD_READERS: dict[str, Callable[[Any, str], Constraint | None]] = {  # field -> (value, param) -> its Constraint
    "response_format": response_format_constraint,
    "guided_json": lambda v, p: Constraint("json_schema", _schema_text(v, p, text_ok=True)),
    "guided_regex": lambda v, p: Constraint("regex", _string(v, p)),
    "guided_choice": _choices,
    "guided_grammar": _grammar,
    "structured_outputs": _structured_outputs,
    "json_schema": lambda v, p: Constraint("json_schema", _schema_text(v, p)),
    "grammar": _grammar,
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
