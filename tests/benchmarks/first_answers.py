"""Which model answers a newcomer's first questions right: twenty short questions (facts,
arithmetic, small code tasks) asked as `zinfer run QUESTION` asks them (the chat template,
`run`'s default sampling), scored against their expected answers. The default model is the
smallest pullable one that answers at least 18 (issue 33).

    python3 tests/benchmarks/first_answers.py smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import trio

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.cli import parser
from zinfer.gateway.client import AsyncClient
from zinfer.gateway.cli_config import sampling_params
from zinfer.messages.client import Delta, Finished

QUESTIONS = [
    ("What is the capital of France?", r"\bParis\b"),
    ("What is the capital of Japan?", r"\bTokyo\b"),
    ("Which planet is known as the Red Planet?", r"\bMars\b"),
    ("Who wrote the play Romeo and Juliet?", r"Shakespeare"),
    ("What is the chemical symbol for gold?", r"\bAu\b"),
    ("How many continents are there on Earth?", r"\b(7|seven)\b"),
    ("What is the largest ocean on Earth?", r"Pacific"),
    ("In which year did World War II end?", r"\b1945\b"),
    ("What is 17 + 25?", r"\b42\b"),
    ("What is 12 times 12?", r"\b144\b"),
    ("What is 100 divided by 4?", r"\b25\b"),
    ("What is 9 squared?", r"\b81\b"),
    ("What is the square root of 64?", r"\b8\b"),
    ("How many minutes are there in 3 hours?", r"\b180\b"),
    ("Write a Python function that returns the sum of a list of numbers.", r"def \w+\(.*\):[\s\S]*(sum\(|\+=)"),
    ("Write a Python function is_even(n) that returns True when n is even.", r"def is_even\(n\)[\s\S]*%\s*2"),
    ("In Python, how do you reverse a string s? Answer with the expression.", r"s\[::-1\]|reversed\(s\)"),
    ("Write a SQL query that selects every row of a table named users.", r"(?i)select\s+\*\s+from\s+users"),
    ("What does HTML stand for?", r"(?i)hyper\s*text\s+markup\s+language"),
    ("Write a JavaScript function that adds two numbers.",
     r"function\s*\w*\s*\(\s*\w+\s*,\s*\w+\s*\)|=>\s*\w+\s*\+\s*\w+"),
]


async def answers(model: str, questions: list[str]) -> list[str]:
    """Each question's answer, asked as `zinfer run` asks it (its default sampling), one at a time."""
    args = parser().parse_args(["run", "--model", model, "x"])
    params = sampling_params(args)
    out = []
    async with (open_engine(EngineConfig(model=model, max_running=1)) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        for q in questions:
            text = []
            async for ev in client.generate(messages=[{"role": "user", "content": q}], params=params):
                if isinstance(ev, Delta):
                    text.append(ev.text)
                elif isinstance(ev, Finished):
                    break
            out.append("".join(text))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--show", action="store_true", help="print every answer")
    args = ap.parse_args()
    for model in args.models:
        t = time.perf_counter()
        got = trio.run(answers, model, [q for q, _ in QUESTIONS])
        right = [bool(re.search(pattern, a)) for (_, pattern), a in zip(QUESTIONS, got)]
        print(f"{model}: {sum(right)}/{len(QUESTIONS)} right ({time.perf_counter() - t:.0f} s)")
        for (q, _), a, ok in zip(QUESTIONS, got, right):
            if args.show or not ok:
                print(f"  {'ok ' if ok else 'NO '} {q!r}: {a[:300]!r}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
