"""The chat page at / in real headless Chromium against a real `zinfer serve`.

Chromium is driven over the Chrome DevTools protocol (its websocket, from Python):
keys are typed with Input.insertText and buttons clicked with mouse events at their
on-screen position, as a user would; the DOM is read back with Runtime.evaluate.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time

import httpx
import pytest
from websockets.sync.client import connect

from zinfer.gateway.client import Client
from zinfer.messages.client import Delta
from zinfer.messages.params import SamplingParams
from http_server import running_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,  # a real model behind a real browser
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
]

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1000,800", "--remote-debugging-port=0",
]


class Page:
    """One Chromium tab over the DevTools protocol: call methods, evaluate JS, type and click."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, **params) -> dict:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            m = json.loads(self.ws.recv(timeout=60))
            if m.get("id") == n:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 120.0):
        deadline = time.monotonic() + timeout_s
        while not (value := self.js(expression)):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression}")
            time.sleep(0.05)
        return value

    def click(self, selector: str) -> None:
        x, y = self.js(f"(() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        """Focus the field, select what is in it and type text over it."""
        self.js(f"(() => {{ const e = document.querySelector({selector!r}); e.focus(); e.select(); }})()")
        self.call("Input.insertText", text=text)


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(smollm2_path, "--max-running", "8") as s:
        yield s


@pytest.fixture
def page(tmp_path):
    profile = tmp_path / "profile"
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list").json()
        with connect(next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"), max_size=None) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def engine_text(server, messages, max_tokens: int) -> str:
    """The engine's greedy answer over ZeroMQ: what the page must show."""
    with Client(server.zmq, timeout_s=120) as c:
        return "".join(ev.text for ev in c.generate(messages=messages, params=SamplingParams(temperature=0.0, max_tokens=max_tokens)) if isinstance(ev, Delta))


LAST_ANSWER = "[...document.querySelectorAll('.msg.assistant')].at(-1)"


def ask(page: Page, text: str) -> None:
    page.type("#input", text)
    page.click("#send")
    page.wait_for(f"{LAST_ANSWER}?.dataset.state === 'streaming'", 10)


def test_chat_page_streams_the_engines_answer_and_stops(server, page, tmp_path):
    page.call("Page.navigate", url=server.url + "/")
    page.wait_for("document.getElementById('status')?.dataset.state === 'open'", 30)
    page.type("#temperature", "0")
    page.type("#max-tokens", "16")

    q1 = "What is the capital of France?"
    ask(page, q1)
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
    shot = tmp_path / "chat.png"
    shot.write_bytes(base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"]))
    print(f"screenshot: {shot}")
    a1 = page.js(f"{LAST_ANSWER}.querySelector('.text').textContent")
    assert a1 and a1 == engine_text(server, [{"role": "user", "content": q1}], 16)

    # the second turn is sent with the first in its messages: same answer as the engine gives that history
    q2 = "And of Germany?"
    page.type("#max-tokens", "8")
    ask(page, q2)
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
    a2 = page.js(f"{LAST_ANSWER}.querySelector('.text').textContent")
    history = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1}, {"role": "user", "content": q2}]
    assert a2 and a2 == engine_text(server, history, 8)

    # the stop button cancels a long answer; the partial text stays on the page
    page.type("#max-tokens", "1000")
    ask(page, "Write a very long story about a dragon.")
    page.wait_for(f"{LAST_ANSWER}.querySelector('.text').textContent.length > 0")
    page.click("#stop")
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'cancelled'", 30)
    assert page.js(f"{LAST_ANSWER}.querySelector('.note').textContent") == "(stopped)"
    assert page.js("conversation.length") == 6
    assert page.js("document.getElementById('send').disabled") is False


def test_chat_page_with_an_api_key_from_its_query(smollm2_path, page):
    key = "sk-page-test"
    with running_server(smollm2_path, "--max-running", "2", api_key=key) as keyed:
        page.call("Page.navigate", url=keyed.url + f"/?api_key={key}&x=1#top")
        page.wait_for("document.getElementById('status')?.dataset.state === 'open'", 30)
        # the key is out of the address bar and history; the rest of the address is kept
        assert page.js("location.href") == keyed.url + "/?x=1#top"
        page.type("#temperature", "0")
        page.type("#max-tokens", "8")
        q = "What is the capital of France?"
        ask(page, q)
        page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
        assert page.js(f"{LAST_ANSWER}.querySelector('.text').textContent") == engine_text(keyed, [{"role": "user", "content": q}], 8)
        # a wrong key: the page itself is refused
        page.call("Page.navigate", url=keyed.url + "/?api_key=wrong")
        page.wait_for("document.readyState === 'complete'", 30)
        assert "invalid_api_key" in page.js("document.body.innerText")
