"""Grammars an attacker sends: deep `$ref` chains, long rule chains, empty languages,
exploding repetitions. Shared by tests/test_hostile_grammars.py and tests/fuzz_grammars.py."""

from __future__ import annotations

import json


def ref_chain_schema(n: int) -> str:
    """A JSON schema of n object schemas, each holding the next through a `$ref` (n=1,500 is
    113 KB and ended `serve` with signal 11 before grammars were measured)."""
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["a"]}
            for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs})


def lark_chain(n: int) -> str:
    """A Lark grammar of n rules, each the next (3,000 overflowed the native stack)."""
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "x"\n'


def gbnf_chain(n: int, name: str = "r") -> str:
    """A GBNF grammar of n + 2 chained rules named name0, name1, ... (its conversion to
    Lark is quadratic in n)."""
    return f"root ::= {name}0\n" + "".join(f"{name}{i} ::= {name}{i + 1}\n" for i in range(n)) + f'{name}{n} ::= "x"\n'


SELF_REF = json.dumps({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
MUTUAL_REF = json.dumps({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})

EMPTY_LANGUAGES = [
    ("json_schema", SELF_REF),
    ("json_schema", MUTUAL_REF),
    ("regex", r"[^\s\S]"),
    ("lark", "start: start"),
    ("gbnf", "root ::= foo\nfoo ::= foo"),
]
"""Grammars that compile but admit no output: the sampler's first mask fails on them."""

PARSER_INTERNALS = ("<state>", "Tokens:", "grm_prefix", "NoExtensionBias", "Parser Error", "non-verbose")
"""Words of llguidance's internal state that no client error may carry."""
