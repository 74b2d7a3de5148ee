"""The chat page at / in real headless Chromium against a real `zinfer serve`.

Chromium is driven over the Chrome DevTools protocol (its websocket, from Python):
text is typed with Input.insertText, keys pressed and buttons clicked with input events
at their on-screen position, as a user would; the DOM is read back with Runtime.evaluate.
The page's state is in `window.zinfer` (chat.js): the chats it keeps, and its renderer.
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
        x, y = self.js(f"(() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect(); "
                       f"return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def press_enter(self, shift: bool = False) -> None:
        """Enter (or Shift+Enter) in the focused element, as a keyboard sends it."""
        mods = 8 if shift else 0
        self.call("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter", windowsVirtualKeyCode=13,
                  text="\r", modifiers=mods)
        self.call("Input.dispatchKeyEvent", type="keyUp", key="Enter", code="Enter", windowsVirtualKeyCode=13,
                  modifiers=mods)

    def screenshot(self, path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        print(f"screenshot: {path}")

    def open(self, url: str) -> None:
        """Load the page (again) and wait for its websocket to connect."""
        self.js("window.oldPage = true")  # not on the new page: the wait below is not fooled by this one
        self.call("Page.navigate", url=url)
        self.wait_for("!window.oldPage && document.getElementById('status')?.dataset.state === 'open'", 30)

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
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        return "".join(ev.text for ev in c.generate(messages=messages,
                                                    params=SamplingParams(temperature=0.0, max_tokens=max_tokens))
                       if isinstance(ev, Delta))


LAST_ANSWER = "[...document.querySelectorAll('.msg.assistant')].at(-1)"
MESSAGES = "zinfer.store.active.messages"  # the chat shown, as the page keeps it: [{role, content, ...}]


def ask(page: Page, text: str) -> None:
    page.type("#input", text)
    page.click("#send")
    page.wait_for(f"{LAST_ANSWER}?.dataset.state === 'streaming'", 10)


def greedy(page: Page, max_tokens: int) -> None:
    page.type("#temperature", "0")
    page.type("#max-tokens", str(max_tokens))


def test_chat_page_streams_the_engines_answer_and_stops(server, page, tmp_path):
    page.open(server.url + "/")
    # the model's name from /v1/models, in the header
    page.wait_for("document.getElementById('model').textContent === 'SmolLM2-135M-Instruct.Q4_1.gguf'", 10)
    greedy(page, 16)

    # Shift+Enter breaks the line and sends nothing; Enter sends
    q1 = "What is the capital of France?"
    page.type("#input", "What is the capital")
    page.press_enter(shift=True)
    assert page.js("document.getElementById('input').value") == "What is the capital\n"
    assert page.js("document.querySelectorAll('.msg').length") == 0
    page.type("#input", q1)
    page.press_enter()
    page.wait_for(f"{LAST_ANSWER}?.dataset.state === 'done'")
    assert page.js("document.getElementById('input').value") == ""
    page.screenshot(tmp_path / "chat.png")
    a1 = page.js(f"{MESSAGES}.at(-1).content")
    assert a1 and a1 == engine_text(server, [{"role": "user", "content": q1}], 16)
    # the speed line: time to first token, tokens/s, and the usage the server reported
    usage = page.js(f"{MESSAGES}.at(-1).stats")
    assert (usage["completion_tokens"] > 1 and usage["prompt_tokens"] > 0 and usage["tps"] > 0
            and 0 < usage["ttft_ms"] <= usage["total_ms"])
    line = page.js(f"{LAST_ANSWER}.querySelector('.stats').textContent")
    assert "s to first token" in line and "tok/s" in line and f"{usage['completion_tokens']} tokens" in line, line
    # actions: copy and regenerate on the answer, copy and edit on the question; no trace link (tracing is off)
    assert page.js(f"[...{LAST_ANSWER}.querySelectorAll('.actions button')].map(b => b.textContent)") == [
        "Copy", "Regenerate"]
    assert page.js("[...document.querySelector('.msg.user .actions').children].map(b => b.textContent)") == [
        "Copy", "Edit"]
    assert page.js("document.querySelector('.trace')") is None

    # the second turn is sent with the first in its messages: same answer as the engine gives that history
    q2 = "And of Germany?"
    page.type("#max-tokens", "8")
    ask(page, q2)
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
    a2 = page.js(f"{MESSAGES}.at(-1).content")
    history = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1}, {"role": "user", "content": q2}]
    assert a2 and a2 == engine_text(server, history, 8)
    assert page.js("document.querySelectorAll('.regenerate').length") == 1  # only on the last answer

    # the stop button cancels a long answer; the partial text stays on the page
    page.type("#max-tokens", "1000")
    ask(page, "Write a very long story about a dragon.")
    page.wait_for(f"{LAST_ANSWER}.querySelector('.body').textContent.length > 0")
    page.click("#stop")
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'cancelled'", 30)
    assert page.js(f"{LAST_ANSWER}.querySelector('.note').textContent") == "(stopped)"
    assert page.js(f"{MESSAGES}.length") == 6
    assert page.js("document.getElementById('send').disabled") is False


FIXED_ANSWER = """### Adding numbers

Here is **bold** text and `inline code`.

```python
def add(a, b):
    return a + b
```

<script>window.pwned = "script"</script>
<img src="x" onerror="window.pwned = 'img'">
<b onmouseover="window.pwned = 'b'">raw html</b>
[click](javascript:window.pwned='link')
"""


def test_renderer_highlights_code_and_shows_html_as_text(server, page):
    """The page's renderer on a fixed answer: markdown becomes elements, code is
    highlighted, and HTML from the model is text that never runs."""
    page.open(server.url + "/")
    page.js(f"""(() => {{
        const d = document.createElement('div');
        d.id = 'fixed';
        d.append(zinfer.renderMarkdown({json.dumps(FIXED_ANSWER)}));
        document.getElementById('log').append(d);
    }})()""")
    assert page.js("document.querySelector('#fixed h3').textContent") == "Adding numbers"
    assert page.js("document.querySelector('#fixed strong').textContent") == "bold"
    assert page.js("document.querySelector('#fixed p code').textContent") == "inline code"
    # the code block: <pre><code> coloured by highlight.js, in a frame with its language and a copy button
    code = "document.querySelector('#fixed pre > code')"
    assert page.js(f"{code}.classList.contains('hljs') && {code}.classList.contains('language-python')")
    assert page.js(f"{code}.textContent") == "def add(a, b):\n    return a + b\n"
    assert page.js(f"{code}.querySelector('.hljs-keyword').textContent") == "def"
    assert page.js("document.querySelector('#fixed .code-head span').textContent") == "python"
    assert page.js("document.querySelector('#fixed .code-head button.copy').textContent") == "Copy"
    # the HTML is shown as text: nothing ran, no element or handler came through
    page.click("#fixed")  # (and a mouse over it)
    time.sleep(0.3)  # an image's onerror would have fired by now
    assert page.js("window.pwned") is None
    assert page.js("document.querySelectorAll("
                   "'#fixed script, #fixed img, #fixed b, #fixed [onerror], #fixed [onmouseover]').length") == 0
    text = page.js("document.getElementById('fixed').textContent")
    assert '<script>window.pwned = "script"</script>' in text and "<img src=\"x\" onerror=" in text
    assert page.js("[...document.querySelectorAll('#fixed a')]"
                   ".every(a => !a.getAttribute('href') || !a.getAttribute('href').startsWith('javascript'))")


def test_html_in_a_models_answer_does_not_run(server, page):
    """End to end: the model (greedy) answers with an onerror payload; the page shows it."""
    q = 'Print this text exactly, without a code block: <img src=x onerror="window.pwned=1">'
    expected = engine_text(server, [{"role": "user", "content": q}], 24)
    assert 'onerror="window.pwned=1"' in expected, expected  # the test means something
    page.open(server.url + "/")
    greedy(page, 24)
    ask(page, q)
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
    assert page.js(f"{MESSAGES}.at(-1).content") == expected
    time.sleep(0.3)
    assert page.js("window.pwned") is None
    assert page.js(f"{LAST_ANSWER}.querySelectorAll('img, [onerror]').length") == 0
    assert '<img src=x onerror="window.pwned=1">' in page.js(f"{LAST_ANSWER}.querySelector('.body').textContent")


def test_chats_are_kept_across_a_reload_and_can_be_switched(server, page):
    page.open(server.url + "/")
    greedy(page, 8)
    q1 = "What is the capital of France?"
    ask(page, q1)
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
    a1 = page.js(f"{MESSAGES}.at(-1).content")

    page.open(server.url + "/")  # a reload: the chat, its answer's speed line and the parameters are back
    assert page.js("[...document.querySelectorAll('.msg .body')].map(e => e.textContent)")[0] == q1
    assert page.js(f"{MESSAGES}.map(m => m.content)") == [q1, a1]
    assert "tok/s" in page.js(f"{LAST_ANSWER}.querySelector('.stats').textContent")
    assert page.js("document.getElementById('max-tokens').value") == "8"
    assert page.js("document.querySelector('#chats li.active .open').textContent") == q1

    # a new chat, then back to the first from the list
    page.click("#new-chat")
    assert page.js("document.querySelectorAll('.msg').length") == 0
    q2 = "Name a color."
    ask(page, q2)
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
    assert page.js("[...document.querySelectorAll('#chats .open')].map(b => b.textContent)") == [q2, q1]
    page.click("#chats li:nth-child(2) .open")
    assert page.js(f"{MESSAGES}.map(m => m.content)") == [q1, a1]

    # regenerate: the last answer again (greedy: the same), in place
    page.click(".regenerate")  # only the last answer has one
    page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
    assert page.js(f"{MESSAGES}.map(m => m.content)") == [q1, a1]

    # edit and resend the question: the old answer goes, the new one answers the new text
    page.click(".msg.user .edit")
    page.type(".msg.user .edit-input", "What is the capital of Italy?")
    page.press_enter()
    page.wait_for(f"{MESSAGES}.length === 2 && {LAST_ANSWER}.dataset.state === 'done'")
    q3 = "What is the capital of Italy?"
    assert page.js(f"{MESSAGES}.map(m => m.content)") == [q3, engine_text(server, [{"role": "user", "content": q3}], 8)]

    # copy buttons put the answer's markdown on the clipboard
    page.call("Browser.grantPermissions", permissions=["clipboardReadWrite", "clipboardSanitizedWrite"],
              origin=server.url)
    page.click("#log > .msg.assistant:last-child .actions .copy")
    page.wait_for(f"{LAST_ANSWER}.querySelector('.actions .copy').textContent === 'Copied'", 5)
    assert page.js("navigator.clipboard.readText()") == page.js(f"{MESSAGES}.at(-1).content")


CODE_CHAT = {
    "id": "shot", "title": "A function that adds", "updated": 1, "messages": [
        {"role": "user", "content": "Write a Python function that adds two numbers."},
        {"role": "assistant", "id": "x", "state": "done", "finish_reason": "stop",
         "content": "Here it is:\n\n```python\ndef add_numbers(num1, num2):\n    \"\"\"The sum of two numbers.\"\"\"\n"
                    "    return num1 + num2\n```\n\nIt **returns** the sum; call it as `add_numbers(2, 3)`.",
         "stats": {"prompt_tokens": 44, "completion_tokens": 52, "cached_tokens": 0, "ttft_ms": 180.5, "tps": 41.2,
                   "total_ms": 1420}},
    ]}


def test_layout_at_desktop_and_phone_width(server, page, tmp_path):
    """A kept chat with code, at 1000 px and at 390 px: nothing wider than the screen, the
    chat list a drawer on the phone."""
    page.open(server.url + "/")
    page.js(f"localStorage.setItem('zinfer.chats.v1', JSON.stringify([{json.dumps(CODE_CHAT)}]))")
    page.open(server.url + "/")
    page.wait_for("!!document.querySelector('.msg.assistant pre code.hljs')", 10)
    page.screenshot(tmp_path / "desktop.png")
    assert page.js("document.getElementById('sidebar').getBoundingClientRect().left") == 0
    assert page.js("getComputedStyle(document.getElementById('menu')).display") == "none"

    page.call("Emulation.setDeviceMetricsOverride", width=390, height=844, deviceScaleFactor=2, mobile=True)
    page.open(server.url + "/")
    page.wait_for("!!document.querySelector('.msg.assistant pre code.hljs')", 10)
    page.screenshot(tmp_path / "phone.png")
    assert page.js("innerWidth") == 390
    assert page.js("document.documentElement.scrollWidth") <= 390  # no sideways scrolling
    rect = "(sel) => document.querySelector(sel).getBoundingClientRect()"
    assert page.js(f"({rect})('#sidebar').right") <= 0  # the drawer is shut
    assert page.js(f"({rect})('#composer').bottom") <= 844 and page.js(f"({rect})('#send').right") <= 390
    assert page.js(f"({rect})('.msg.assistant').right") <= 390
    page.click("#menu")
    page.wait_for(f"({rect})('#sidebar').left === 0", 5)
    page.click("#chats .open")  # picking a chat shuts the drawer
    page.wait_for(f"({rect})('#sidebar').right <= 0", 5)


def test_answers_link_their_trace_when_the_server_traces(smollm2_path, page, tmp_path):
    with running_server(smollm2_path, "--trace-dir", str(tmp_path / "traces")) as traced:
        page.open(traced.url + "/")
        greedy(page, 6)
        ask(page, "Hi")
        page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
        page.wait_for(f"!!{LAST_ANSWER}.querySelector('a.trace')", 10)
        rid = page.js(f"{MESSAGES}.at(-1).id")
        assert page.js(f"{LAST_ANSWER}.querySelector('a.trace').href") == f"{traced.url}/v1/traces/{rid}"
        doc = page.js(f"fetch({LAST_ANSWER}.querySelector('a.trace').href).then(r => r.json())")
        events = doc["traceEvents"]
        tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert any(t.startswith("request ws") and t.endswith("." + rid) for t in tracks), tracks
        cats = {e.get("cat") for e in events if e["ph"] == "X"}
        assert {"request", "round", "request.round", "kernel"} <= cats, cats
        # one prefill and a decode round per token after the first
        usage = page.js(f"{MESSAGES}.at(-1).stats")
        assert sum(e.get("cat") == "request.round" for e in events) == usage["completion_tokens"]
        assert httpx.get(traced.url + "/v1/traces/not-a-request").status_code == 404


def test_chat_page_with_an_api_key_from_its_query(smollm2_path, page):
    key = "sk-page-test"
    with running_server(smollm2_path, "--max-running", "2", api_key=key) as keyed:
        page.open(keyed.url + f"/?api_key={key}&x=1#top")
        # the key is out of the address bar and history; the rest of the address is kept
        assert page.js("location.href") == keyed.url + "/?x=1#top"
        # the page's libraries load without it, and its own requests carry it (the model's name)
        page.wait_for("document.getElementById('model').textContent !== ''", 10)
        assert page.js("typeof marked + typeof DOMPurify + typeof hljs") == "objectfunctionobject"
        greedy(page, 8)
        q = "What is the capital of France?"
        ask(page, q)
        page.wait_for(f"{LAST_ANSWER}.dataset.state === 'done'")
        assert page.js(f"{MESSAGES}.at(-1).content") == engine_text(keyed, [{"role": "user", "content": q}], 8)
        # a wrong key: the page itself is refused
        page.call("Page.navigate", url=keyed.url + "/?api_key=wrong")
        page.wait_for("document.readyState === 'complete'", 30)
        assert "invalid_api_key" in page.js("document.body.innerText")
