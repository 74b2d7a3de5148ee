"""A fuzz target for grammars: hypothesis strategies for deep, wide, recursive, exploding and
empty-language grammars of every kind (JSON schema, regex, Lark, GBNF, choice), sent to a
real `zinfer serve` on a tiny model, with the invariants of the integrity suite:

- the answer is 200 or 400, or the one documented 500: a grammar that compiled but
  reached a rule that never completes ("the grammar allows nothing after ...");
- the process lives; every request ends once; afterwards nothing is in flight, no KV
  block is held and the greedy text is unchanged (fuzz_surfaces.ServerUnderTest);
- another client's /health never waits 0.5 s or more (a poller runs throughout).

tests/test_fuzz_grammars.py runs it in the slow tier; `python3 tests/fuzz_grammars.py
--minutes 10` runs it for that long and prints how many cases ran and how they ended.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_surfaces import ServerUnderTest  # noqa: E402
from hostile_grammars import EMPTY_LANGUAGES, gbnf_chain, lark_chain, ref_chain_schema  # noqa: E402

FIELD = {"json_schema": "guided_json", "regex": "guided_regex", "lark": "guided_grammar", "gbnf": "grammar",
         "choice": "guided_choice"}
DEAD_END = "the grammar allows nothing after"
HEALTH_LIMIT = 0.5

# ---- strategies --------------------------------------------------------------------------

names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)

leaf_schemas = st.one_of(
    st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null", "object", "array")]),
    st.builds(lambda lo, hi: {"type": "integer", "minimum": lo, "maximum": hi},
              st.integers(-10**20, 10**20), st.integers(-10**20, 10**20)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 10**7)),
    st.builds(lambda n: {"type": "array", "maxItems": n, "items": {"type": "integer"}}, st.integers(0, 10**7)),
    st.builds(lambda p: {"type": "string", "pattern": p},
              st.sampled_from(["^[a-z]+$", "(x{100}){1000}", r"[^\s\S]", "(", "a{2,1}"])),
    st.lists(words, max_size=5).map(lambda e: {"enum": e}),
    st.sampled_from([True, False, {}, {"not": {}}, {"type": "nope"},
                     {"$ref": "#"}, {"$ref": "#/nowhere"}, {"$ref": "http://x/y"}]),
)


def _wrap(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.dictionaries(names, children, max_size=6).map(
            lambda p: {"type": "object", "properties": p, "required": sorted(p)[:2]}),
        children.map(lambda c: {"type": "array", "items": c}),
        st.lists(children, min_size=1, max_size=4).flatmap(
            lambda cs: st.sampled_from(["anyOf", "oneOf", "allOf"]).map(lambda k: {k: cs})),
    )


nested_schemas = st.recursive(leaf_schemas, _wrap, max_leaves=40)


@st.composite
def ref_graphs(draw) -> dict:
    """$defs whose objects reference each other at random: chains, cycles, self-references."""
    n = draw(st.integers(1, 60))
    defs = {}
    for i in range(n):
        targets = draw(st.lists(st.integers(0, n - 1), max_size=3))
        props = {f"p{j}": {"$ref": f"#/$defs/d{t}"} for j, t in enumerate(targets)}
        defs[f"d{i}"] = (draw(st.sampled_from([{"type": "object", "properties": props, "required": sorted(props)},
                                               {"anyOf": [*props.values(), {"type": "null"}]}]))
                         if props else draw(leaf_schemas))
    return {"$defs": defs, "$ref": f"#/$defs/d{draw(st.integers(0, n - 1))}"}


def deep_arrays(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


json_schemas = st.one_of(
    nested_schemas,
    ref_graphs(),
    st.integers(1, 400).map(deep_arrays),
    st.integers(1, 2000).map(lambda n: json.loads(ref_chain_schema(n))),
).map(json.dumps)

regex_atoms = st.sampled_from(["a", "[a-z]", r"\d", ".", r"[^\s\S]", r"\p{L}", "(a|b)", "x*", "y+", "z?", "",
                               "\\", "[", "(?P<n>a)", "(?=a)", "\\1"])


@st.composite
def regexes(draw) -> str:
    kind = draw(st.sampled_from(["flat", "nested", "counted", "deep"]))
    if kind == "deep":
        n = draw(st.integers(1, 2000))
        return "(" * n + draw(regex_atoms) + ")" * n
    parts = draw(st.lists(regex_atoms, min_size=1, max_size=12))
    text = "".join(parts)
    if kind == "nested":
        for _ in range(draw(st.integers(1, 6))):
            text = f"({text}|{draw(regex_atoms)})"
    if kind in ("nested", "counted"):
        for _ in range(draw(st.integers(1, 4))):
            lo = draw(st.integers(0, 2000))
            text = f"({text}){{{lo},{lo + draw(st.integers(0, 2000))}}}"
    return text


@st.composite
def lark_grammars(draw) -> str:
    kind = draw(st.sampled_from(["random", "chain", "self", "repeat", "json"]))
    if kind == "chain":
        return lark_chain(draw(st.integers(1, 3000)))
    if kind == "self":
        return "start: start" if draw(st.booleans()) else 'start: "a" b\nb: b'
    if kind == "repeat":
        return (f'start: ("x" ~ {draw(st.integers(0, 2000))}..{draw(st.integers(0, 2000))}) '
                f'~ {draw(st.integers(0, 2000))}')
    if kind == "json":
        return f'start: "say " %json {draw(json_schemas)}'
    n = draw(st.integers(1, 30))
    rules = []
    for i in range(n):
        alts = draw(st.lists(st.lists(st.one_of(st.integers(0, n - 1).map(lambda t: f"r{t}"), words.map(json.dumps),
                                                st.just("/[a-z]+/")), min_size=1, max_size=4),
                             min_size=1, max_size=3))
        rules.append(f"r{i}: " + " | ".join(" ".join(a) for a in alts))
    return "start: r0\n" + "\n".join(rules)


@st.composite
def gbnf_grammars(draw) -> str:
    kind = draw(st.sampled_from(["random", "chain", "self"]))
    if kind == "chain":
        return gbnf_chain(draw(st.integers(1, 2500)))
    if kind == "self":
        return "root ::= foo\nfoo ::= foo"
    n = draw(st.integers(1, 30))
    item = st.one_of(st.integers(0, n - 1).map(lambda t: f"r{t}"), words.map(json.dumps), st.just("[a-z]*"))
    rules = [f"r{i} ::= " + " | ".join(" ".join(a) for a in draw(st.lists(st.lists(item, min_size=1, max_size=4),
                                                                          min_size=1, max_size=3)))
             for i in range(n)]
    return "root ::= r0\n" + "\n".join(rules)


grammars = st.one_of(
    st.tuples(st.just("json_schema"), json_schemas),
    st.tuples(st.just("regex"), regexes()),
    st.tuples(st.just("lark"), lark_grammars()),
    st.tuples(st.just("gbnf"), gbnf_grammars()),
    st.tuples(st.just("choice"), st.lists(words, max_size=6)),
    st.sampled_from(EMPTY_LANGUAGES),
    st.tuples(st.sampled_from(list(FIELD)), st.text(max_size=200)),  # garbage of each kind
)


# ---- the case ----------------------------------------------------------------------------


class HealthPoller:
    """Polls /health every 50 ms in a thread; worst() is the slowest answer since the last call."""

    def __init__(self, url: str):
        self.url, self.slowest, self.stop = url, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    c.get(self.url + "/health")
                except httpx.HTTPError:
                    pass  # a dead server is the case's failure, reported there
                self.slowest = max(self.slowest, time.perf_counter() - t)
                time.sleep(0.05)

    def worst(self) -> float:
        slowest, self.slowest = self.slowest, 0.0
        return slowest

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def grammar_case(sut: ServerUnderTest, kind: str, spec: object, outcomes: Counter) -> None:
    """One grammar through /v1/completions, then the server's health and invariants."""
    value = json.loads(spec) if kind == "json_schema" and _is_json(spec) else spec
    body = {"prompt": "x", "max_tokens": 8, "temperature": 0.8, "seed": 1, FIELD[kind]: value}
    case = (kind, str(spec)[:500])
    r = sut.http.post("/v1/completions", json=body)
    message = r.json().get("error", {}).get("message", "") if r.status_code != 200 else ""
    outcomes[f"{r.status_code} {kind}"] += 1
    documented = r.status_code == 500 and DEAD_END in message
    assert r.status_code in (200, 400) or documented, f"HTTP {r.status_code}: {r.text[:500]}\ncase: {case!r}"
    sut.check_healthy(case)


def _is_json(text: object) -> bool:
    try:
        json.loads(text)  # type: ignore[arg-type]
        return True
    except (TypeError, ValueError, RecursionError):
        return False


FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))


class TimeUp(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    args = ap.parse_args()
    from tiny import write_tiny_gguf

    model = write_tiny_gguf(Path(tempfile.mkdtemp()) / "tiny-llama.gguf", "llama", seed=5)
    sut = ServerUnderTest(model, "--max-running", "8", timeout=30.0)
    poller = HealthPoller(sut.ensure_alive().url)
    outcomes: Counter = Counter()
    deadline = time.monotonic() + args.minutes * 60
    slowest = [0.0]

    @settings(max_examples=10**9, phases=[Phase.generate], **FUZZ)
    @given(grammar=grammars)
    def run(grammar):
        if time.monotonic() > deadline:
            raise TimeUp
        sut.ensure_alive()
        sut.run_case(grammar_case, sut, *grammar, outcomes, case=grammar)
        worst = poller.worst()
        slowest[0] = max(slowest[0], worst)
        assert worst < HEALTH_LIMIT, f"/health took {worst:.2f} s during case {str(grammar)[:500]!r}"

    try:
        run()
    except TimeUp:
        pass
    finally:
        poller.close()
        sut.close()
    print(f"{sum(outcomes.values())} cases in {args.minutes:g} min, server restarts {sut.restarts}, "
          f"slowest /health {slowest[0] * 1e3:.0f} ms")
    for key, count in sorted(outcomes.items()):
        print(f"  {key}: {count}")


if __name__ == "__main__":
    main()
