"""What a JSON-schema Constraint (messages/params.py) means on both sides of the wire: the
keywords that hold subschemas, a walk over them, and the layout of the JSON it produces.

The gateway closes schemas with these (strict structured output, tool calls); the engine
measures and bounds them (actors/grammar_limits.py, actors/constraints.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # in llguidance's stub only

SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
SUBSCHEMAS = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
              "propertyNames", "not", "if", "then", "else", "contains")
MAX_SCHEMA_DEPTH = 64

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How JSON-schema output is laid out: one space after ',' and ':', no other whitespace, so a
model cannot spend its tokens on whitespace (a schema's "x-guidance" may say otherwise)."""


def map_schemas(schema: Any, fn: Callable[[dict[str, Any]], dict[str, Any]], depth: int = 0) -> Any:
    """fn applied to every object (sub)schema of schema, innermost first: a new schema,
    schema itself is not mutated (fn gets a copy). true/false schemas, and what lies
    deeper than MAX_SCHEMA_DEPTH, are left as they are."""
    if not isinstance(schema, Mapping) or depth > MAX_SCHEMA_DEPTH:
        return schema
    out = dict(schema)
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: map_schemas(v, fn, depth + 1) for k, v in out[key].items()}
    for key in SUBSCHEMA_LISTS:  # items among them: a list in draft 4's tuple form
        if isinstance(out.get(key), list):
            out[key] = [map_schemas(v, fn, depth + 1) for v in out[key]]
    for key in SUBSCHEMAS:
        if isinstance(out.get(key), Mapping):
            out[key] = map_schemas(out[key], fn, depth + 1)
    return fn(out)
