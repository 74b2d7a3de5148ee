"""Every ```sh and ```python block of README.md runs as written (issue 33: the README is
the user's manual).

The blocks run in README order in one scratch directory, against the models in the cache:
shell blocks through bash (`set -euo pipefail`), python blocks with python3 in a
subprocess. A `zinfer serve` line starts its server in the background (the one before it is
stopped first), the test waits for its /health, and the blocks after it talk to it, as a
user's second terminal would; the last one is stopped at the end. Two rewrites only: the
ports 8080 and 5555 become free ones (other tests serve on this host too), and a command
listed in ALREADY_DONE is not run again (see there).

What does not run: a block preceded by `<!-- readme-test: skip: REASON -->`, and the
commands of ALREADY_DONE. Both are listed, and the list must be exactly KNOWN_SKIPS, so a
new block the test cannot run fails here until it is either made runnable or skipped with
its reason.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SKIP_MARK = re.compile(r"<!-- readme-test: skip: (.+?) -->")

# Commands the suite must not run again, with why: they are done by the time it runs.
ALREADY_DONE = {
    "python3 -m pip install -e '.[dev]'": "the suite runs inside this install "
                                          "(reinstalling would change the package under every running test)",
}

# Everything of README.md that does not run here: (the block's or command's text, reason).
KNOWN_SKIPS = {
    (".ci/run", "runs the whole suite, this test among it"),
    ("python3 -m pip install -e '.[dev]'", ALREADY_DONE["python3 -m pip install -e '.[dev]'"]),
    ("zinfer serve --replicas 2 --threads 1 --model smollm2-135m",
     "starts Ray and two replicas; tests/test_replicas.py serves them on a Ray cluster"),
}

# Text a block's output must contain (a user would notice its absence), by a piece of the block.
EXPECT = {
    'zinfer run "What is the capital of France?"': "Paris",
    "curl -s http://127.0.0.1:8080/v1/chat/completions": '"choices"',
    "zinfer --version": "zinfer",
    "zinfer trace summarize": "kernel",
    "engine.complete(": " ",
    "client.generate(": " ",
}

STEP_TIMEOUT_S = 240


@dataclass
class Block:
    lang: str  # "sh" or "python"
    text: str
    line: int  # 1-based line of the opening fence
    skip: str | None  # the reason of a readme-test skip mark


def readme_blocks(text: str, langs: tuple[str, ...] = ("sh", "python")) -> list[Block]:
    """The fenced blocks of `text` in `langs`, in order, with their skip mark (an HTML
    comment on the line before the fence)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start = lines[i][3:].strip(), i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            mark = SKIP_MARK.fullmatch(lines[i - 1].strip()) if i > 0 else None
            if lang in langs:
                blocks.append(Block(lang, "\n".join(lines[start + 1:end]) + "\n", start + 1,
                                    mark.group(1) if mark else None))
            i = end + 1
        else:
            i += 1
    return blocks


def shell_commands(text: str) -> list[str]:
    """The block's commands, one per logical line (backslash continuations joined), comment
    lines dropped."""
    commands, current = [], ""
    for line in text.splitlines():
        current += line
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            commands.append(current.strip())
        current = ""
    return commands


def test_every_readme_block_is_sh_python_or_text_and_the_skips_are_the_known_few():
    """Fast: the README's runnable blocks are fenced and tagged (an untagged or indented
    command would escape the slow test), and nothing new is skipped."""
    text = README.read_text()
    every = readme_blocks(text, langs=("sh", "python", "text", ""))
    assert len(every) == text.count("\n```") // 2, "a fence in another language: tag it sh, python or text"
    untagged = [b.line for b in every
                if b.lang in ("", "text") and re.search(r"^(zinfer|python3?|curl) |^import ", b.text, flags=re.M)]
    assert not untagged, f"README.md lines {untagged}: a command in an untagged or text fence: tag it sh or python"
    assert not re.findall(r"^(?: {4}|\t)(?:zinfer|python3?|curl) ", text, flags=re.M), (
        "an indented command: fence it as ```sh")
    assert _skips(readme_blocks(text)) == KNOWN_SKIPS


def _skips(blocks: list[Block]) -> set[tuple[str, str]]:
    skips = {(b.text.strip(), b.skip) for b in blocks if b.skip}
    for b in blocks:
        if b.lang == "sh" and not b.skip:
            for command in shell_commands(b.text):
                skips |= {(part, ALREADY_DONE[part]) for part in command.split(" && ") if part in ALREADY_DONE}
    return skips


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A `zinfer serve` command started in the background, as a second terminal runs it."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]):
        self.command = command
        port = int(re.search(r"--port (\d+)", command).group(1))
        self.log = (cwd / f"serve-{port}.log").open("w")
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            assert self.proc.poll() is None, f"{command} exited {self.proc.returncode}:\n{self.output()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{command}: no /health in {STEP_TIMEOUT_S} s:\n{self.output()}"
            time.sleep(0.5)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def stop(self) -> None:
        """SIGINT (Ctrl-C), as a user stops it; it must exit cleanly within 60 s."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.command} did not stop on SIGINT:\n{self.output()}") from None
        self.log.close()


def _check(what: str, done: subprocess.CompletedProcess, block: Block) -> str:
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"README.md:{block.line}: {what} exited {done.returncode}:\n{out[-3000:]}"
    for piece, expected in EXPECT.items():
        if piece in what:
            assert expected in done.stdout, (f"README.md:{block.line}: {expected!r} not in the output of {what}:\n"
                                             f"{out[-3000:]}")
    return out


@pytest.mark.slow  # starts ~15 engines and 3 servers on the real models (~3-4 minutes on 2 cores)
def test_every_readme_snippet_runs_as_written(tmp_path):
    http_port, zmq_port = _free_port(), _free_port()
    blocks = readme_blocks(README.read_text())
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    env.pop("NUMBA_CACHE_DIR", None)  # a user's runs use zinfer's own cache folder
    server: _Server | None = None
    ran, timings = 0, []
    try:
        for block in blocks:
            if block.skip:
                continue
            text = block.text.replace("8080", str(http_port)).replace("5555", str(zmq_port))
            start = time.monotonic()
            if block.lang == "python":
                done = subprocess.run([sys.executable, "-c", text], cwd=tmp_path, env=env, capture_output=True,
                                      text=True, timeout=STEP_TIMEOUT_S)
                _check(text, done, block)
            else:
                script: list[str] = []
                for command in shell_commands(text) + [""]:
                    if command.startswith("zinfer serve") or not command:
                        if script:
                            body = "\n".join(script)
                            done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env,
                                                  capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
                            _check(body, done, block)
                            script = []
                        if command:
                            if server is not None:
                                server.stop()
                            server = _Server(command, tmp_path, env)
                    else:
                        script.append(" && ".join(":" if part in ALREADY_DONE else part
                                                  for part in command.split(" && ")))
            ran += 1
            timings.append(f"README.md:{block.line} {block.lang} {time.monotonic() - start:.1f} s")
    finally:
        if server is not None:
            server.stop()
    skips = _skips(blocks)
    print(f"\nREADME: {ran} blocks ran, {len(skips)} skipped:", *timings,
          *(f"skipped {what!r}: {why}" for what, why in sorted(skips)), sep="\n  ")
    assert skips == KNOWN_SKIPS
    assert ran >= 12
