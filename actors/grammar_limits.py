"""What a grammar may be before any library compiles it: sizes, rule counts, reference
chains and repetition bounds, measured in pure Python over the spec's text.

llguidance compiles schemas and Lark grammars by recursion on the native stack, so a long
enough chain of `$ref`-linked schemas or Lark rules overflows it and ends the process; GBNF
converts to Lark in llguidance's Python code in time quadratic in the rule count; nested
counted repetitions multiply the work before the first mask (BENCHMARKS.md,
"actors/grammar_limits.py", has the sizes that did each). So every constraint is measured
here first, in time linear in its size (256 KiB at most):

- json_schema: at most MAX_NODES subschemas; no chain of subschemas and `$ref` hops
  longer than MAX_CHAIN (measured as the longest path through the strongly connected
  parts of the reference graph, each part counted whole: an upper bound on the stack
  any compile order can build); every `pattern` within the repetition bound.
- lark: at most MAX_RULES rules, reference chains as above, `%json` schemas as above,
  literal regexes and `~ m..n` repetitions within the bound.
- gbnf: at most MAX_GBNF_RULES rules (it becomes Lark, then is measured as Lark).
- regex: nested counted repetitions multiply to at most MAX_REPETITION.

check_limits raises ValueError with one line naming the problem. What passes here is
compiled by the grammar worker (actors/grammar_worker.py) in a separate process on a
smaller stack than any engine thread has, so no limit here needs to be exact.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator, Mapping

from zinfer.messages.json_schema import SUBSCHEMA_LISTS, SUBSCHEMA_MAPS, SUBSCHEMAS
from zinfer.messages.params import MAX_CONSTRAINT_BYTES, Constraint

MAX_NODES = 5000
"""Subschemas (objects) in one JSON schema, `%json` blocks of a Lark grammar together."""
MAX_CHAIN = 128
"""The longest chain of nested subschemas, `$ref` hops or Lark rule references."""
MAX_RULES = 2000
"""Rules and terminals of one Lark grammar."""
MAX_GBNF_RULES = 1000
"""Rules of one GBNF grammar (its conversion to Lark is quadratic in the rule count)."""
MAX_REPETITION = 10_000
"""The product of nested counted repetitions (`{m,n}`, `~ m..n`) in one regex or rule."""


def check_limits(c: Constraint) -> None:
    """Raise ValueError naming the first limit c's spec exceeds; return if it is within all."""
    if len(c.spec.encode("utf-8", "surrogatepass")) > MAX_CONSTRAINT_BYTES:
        raise ValueError(f"the grammar is larger than {MAX_CONSTRAINT_BYTES >> 10} KiB")
    if c.kind == "json_schema":
        check_schema(parse_json(c.spec, "the JSON schema"))
    elif c.kind == "regex":
        check_regex(c.spec)
    elif c.kind == "lark":
        check_lark(c.spec)
    elif c.kind == "gbnf":
        rules = len(re.findall(r"::=", c.spec))
        if rules > MAX_GBNF_RULES:
            raise ValueError(f"the GBNF grammar has {rules} rules, more than the {MAX_GBNF_RULES} allowed")


def parse_json(text: str, what: str) -> Any:
    """text as JSON; ValueError (not RecursionError) when it is not JSON or nests too deep."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} nests too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


# ---- JSON schemas ----------------------------------------------------------------------


def check_schema(schema: Any, counted: list[int] | None = None) -> None:
    """Raise ValueError if schema has too many subschemas, too long a chain of them (nesting
    and `$ref` hops), or a `pattern` past the repetition bound. counted: a running total of
    subschemas shared by the schemas of one grammar."""
    counted = counted if counted is not None else [0]
    nodes: dict[int, Any] = {}  # id -> subschema object
    edges: dict[int, list[int]] = {}
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, Mapping) or id(node) in nodes:
            continue
        nodes[id(node)] = node
        counted[0] += 1
        if counted[0] > MAX_NODES:
            raise ValueError(f"the JSON schema has more than {MAX_NODES} subschemas")
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            check_regex(pattern)
        children = [c for c in _subschemas(node) if isinstance(c, Mapping)]
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _resolve(schema, ref)
            if isinstance(target, Mapping):
                children.append(target)
        edges[id(node)] = [id(c) for c in children]
        stack.extend(children)
    chain = longest_chain(edges)
    if chain > MAX_CHAIN:
        raise ValueError(f"the JSON schema nests subschemas and $refs {chain} deep, more than the {MAX_CHAIN} allowed")


def _subschemas(node: Mapping[str, Any]) -> Iterator[Any]:
    for key in SUBSCHEMA_MAPS:
        if isinstance(node.get(key), Mapping):
            yield from node[key].values()
    for key in SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from node[key]
    for key in SUBSCHEMAS:
        if isinstance(node.get(key), Mapping):
            yield node[key]


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local `$ref` ("#", "#/$defs/a", JSON pointer escapes) names, else None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# ---- reference graphs ------------------------------------------------------------------


def longest_chain(edges: Mapping[Any, list[Any]]) -> int:
    """An upper bound on the deepest recursion a compiler walking edges can reach when it
    compiles each node once: the longest path through the graph's strongly connected parts,
    each counted by its size. Iterative (Tarjan's algorithm, then a pass in reverse
    topological order), so it runs at any depth."""
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    on_stack: set[Any] = set()
    stack: list[Any] = []
    part_of: dict[Any, int] = {}
    parts: list[list[Any]] = []  # in reverse topological order: a part's successors come first
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            child = next(it, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part: list[Any] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part_of[member] = len(parts)
                    part.append(member)
                    if member == node:
                        break
                parts.append(part)
    depth = [0] * len(parts)
    for i, part in enumerate(parts):
        after = [depth[part_of[c]] for m in part for c in edges.get(m, ()) if part_of[c] != i]
        depth[i] = len(part) + max(after, default=0)
    return max(depth, default=0)


# ---- Lark --------------------------------------------------------------------------------

_RULE = re.compile(r"^[ \t]*[?!]?([A-Za-z_][A-Za-z0-9_]*)(?:\.-?\d+)?[ \t]*:(?!:)", re.M)
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"i?|/(?:[^/\\\n]|\\.)+/[imslux]*')
_COMMENT = re.compile(r"//[^\n]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_lark(text: str) -> None:
    """Raise ValueError if a Lark grammar has too many rules, too long a chain of rule
    references, an embedded `%json` schema past the schema limits, or a regex or rule
    whose counted repetitions multiply past MAX_REPETITION."""
    text, schemas = _split_json_blocks(text)
    counted = [0]
    for schema in schemas:
        check_schema(schema, counted)
    for m in _LITERAL.finditer(text):
        if m.group().startswith("/"):
            check_regex(m.group()[1 : m.group().rindex("/")])
    body_text = _LITERAL.sub('""', _COMMENT.sub("", text))
    starts = list(_RULE.finditer(body_text))
    if len(starts) > MAX_RULES:
        raise ValueError(f"the Lark grammar has {len(starts)} rules, more than the {MAX_RULES} allowed")
    bodies: dict[str, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(body_text)
        bodies[m.group(1)] = bodies.get(m.group(1), "") + " " + body_text[m.end() : end]
    edges = {name: [r for r in set(_NAME.findall(body)) if r in bodies] for name, body in bodies.items()}
    chain = longest_chain(edges)
    if chain > MAX_CHAIN:
        raise ValueError(f"the Lark grammar chains rule references {chain} deep, more than the {MAX_CHAIN} allowed")
    for name, body in bodies.items():
        if repetition_product(body, lark=True) > MAX_REPETITION:
            raise ValueError(f"rule {name} of the Lark grammar repeats more than {MAX_REPETITION} times when expanded")


def _split_json_blocks(text: str) -> tuple[str, list[Any]]:
    """text with each `%json {...}` block replaced by `""`, and the blocks' schemas."""
    decoder = json.JSONDecoder()
    out, schemas, pos = [], [], 0
    for m in re.finditer(r"%json\s*", text):
        if m.start() < pos:
            continue
        try:
            schema, end = decoder.raw_decode(text, m.end())
        except RecursionError:
            raise ValueError("a %json schema of the Lark grammar nests too deeply") from None
        except ValueError:
            continue  # not JSON: llguidance will say what is wrong
        out.append(text[pos : m.start()] + '""')
        schemas.append(schema)
        pos = end
    out.append(text[pos:])
    return "".join(out), schemas


# ---- regexes -----------------------------------------------------------------------------

_COUNT = re.compile(r"\{(\d{1,9})(?:,(\d{0,9}))?\}")
_LARK_COUNT = re.compile(r"~\s*(\d{1,9})(?:\s*\.\.\s*(\d{1,9}))?")


def check_regex(regex: str) -> None:
    """Raise ValueError if regex's nested counted repetitions multiply past MAX_REPETITION."""
    if repetition_product(regex) > MAX_REPETITION:
        raise ValueError(f"the regex {_short(regex)} repeats more than {MAX_REPETITION} times when expanded")


def repetition_product(text: str, lark: bool = False) -> int:
    """The largest product of counted repetitions nested in text (a regex, or with lark a
    rule body whose literals are blanked): `(a{10}){20}` is 200. `*`, `+` and open bounds
    loop rather than expand and count once (`{m,}` counts m)."""
    best = [1]  # per open group: the largest product inside it so far
    last = 1  # the product of the item just closed (an atom: 1)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if lark and ch.isspace():
            i += 1
            continue
        count = _COUNT.match(text, i) or (_LARK_COUNT.match(text, i) if lark else None)
        if count:
            bound = int(count.group(2) or count.group(1))  # {m}, {m,}: m; {m,n}: n
            best[-1] = max(best[-1], last * max(bound, 1))
            i = count.end()
            continue
        if ch == "\\":
            if text[i + 1 : i + 2] in ("p", "P", "x", "u") and text[i + 2 : i + 3] == "{":
                i = text.find("}", i) + 1 or n  # \p{...}, \x{...}: one atom
            else:
                i += 2
            last = 1
            continue
        if ch == "[" and not lark:
            i = _class_end(text, i)
            last = 1
            continue
        if ch == "(":
            best.append(1)
        elif ch == ")" and len(best) > 1:
            last = best.pop()
            best[-1] = max(best[-1], last)
        else:
            last = 1
        i += 1
    return max(best)


def _class_end(text: str, i: int) -> int:
    """The index after the character class opening at text[i] ('[')."""
    j = i + 1
    if text[j : j + 1] == "^":
        j += 1
    if text[j : j + 1] == "]":
        j += 1
    while j < len(text) and text[j] != "]":
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")
