"""Varied pydantic models for structured-output acceptance runs (issue #17): nested objects,
arrays, enums, numbers with bounds, optional fields and unions, drawn deterministically.

`models(count)` gives the same list on every run; each model's JSON schema is what a client
sends (model_json_schema()), and model_validate_json() is the check an output must pass.
"""

from __future__ import annotations

import json
import random
from enum import Enum
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, create_model

WORDS = ["city", "book", "planet", "recipe", "song", "tree", "river", "robot", "train", "garden", "movie", "bridge"]


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


def _field(rng: random.Random, depth: int) -> tuple[Any, Any]:
    """(annotation, default) of one drawn field; nested objects while depth allows."""
    kind = rng.choice(["str", "int", "float", "bool", "enum", "literal", "list", "optional", "union", "object"]
                      if depth < 2
                      else ["str", "int", "float", "bool", "enum", "literal", "list", "optional", "union"])
    if kind == "str":
        return (str, Field(max_length=rng.choice([12, 24, 40]))) if rng.random() < 0.7 else (str, ...)
    if kind == "int":
        lo = rng.choice([0, -50, 1])
        return int, Field(ge=lo, le=lo + rng.choice([9, 100, 5000]))
    if kind == "float":
        return float, Field(ge=0.0, le=rng.choice([1.0, 100.0, 1e4]))
    if kind == "bool":
        return bool, ...
    if kind == "enum":
        return Color, ...
    if kind == "literal":
        return Literal["small", "medium", "large"], ...
    if kind == "list":
        item = rng.choice([str, int, Color])
        return list[item], Field(min_length=rng.choice([0, 1]), max_length=rng.choice([3, 5]))
    if kind == "optional":
        return Optional[rng.choice([str, int, bool])], None
    if kind == "union":
        return Union[int, str], ...
    return _model(rng, depth + 1, f"Part{rng.randrange(10**6)}"), ...


def _model(rng: random.Random, depth: int, name: str) -> type[BaseModel]:
    n = rng.randint(1, 4) if depth else rng.randint(2, 5)
    fields = {f"f{i}_{rng.choice(WORDS)}": _field(rng, depth) for i in range(n)}
    return create_model(name, **fields)


def ask_messages(model: type[BaseModel]) -> list[dict[str, str]]:
    """The chat that asks for an instance of model, its JSON schema in the prompt."""
    schema = json.dumps(model.model_json_schema())
    return [{"role": "user",
             "content": f"Give an example of a {model.__name__} as JSON matching this schema: {schema}"}]


def models(count: int, seed: int = 17) -> list[type[BaseModel]]:
    """count drawn models, the same ones for the same (count, seed)."""
    rng = random.Random(seed)
    return [_model(rng, 0, f"Thing{i}") for i in range(count)]
