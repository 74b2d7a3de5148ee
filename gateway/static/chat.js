// The zinfer chat page: talks to /v1/ws (protocol: gateway/PROTOCOL.md).
// The conversation lives here, in `conversation`, and is sent whole with each turn.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];       // [{role, content}] of finished turns
let socket = null;
let current = null;            // the generation streaming now: {id, el, text, user}
let counter = 0;
let retryMs = 500;
const apiKey = takeApiKey();  // with `zinfer serve --api-key`: opened as /?api_key=KEY

// Read ?api_key from the address and take it out of the address bar and history, so it
// is not shown, bookmarked or shared; the page keeps it in memory for its websocket.
function takeApiKey() {
  const url = new URL(location.href);
  const key = url.searchParams.get("api_key");
  if (key !== null) {
    url.searchParams.delete("api_key");
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
  }
  return key;
}

function socketUrl() {
  const url = new URL("v1/ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = apiKey ? "?api_key=" + encodeURIComponent(apiKey) : "";
  url.hash = "";
  return url.href;
}

function setStatus(state, text) {
  $("status").dataset.state = state;
  $("status").textContent = text;
}

function connect() {
  socket = new WebSocket(socketUrl());
  socket.onopen = () => { retryMs = 500; setStatus("open", "connected"); };
  socket.onmessage = (e) => onMessage(JSON.parse(e.data));
  socket.onclose = () => {
    setStatus("closed", "disconnected, retrying…");
    if (current) end("error", "the connection closed");
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 8000);
  };
}

function bubble(role, text) {
  const el = document.createElement("div");
  el.className = "msg " + role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  el.appendChild(body);
  $("log").appendChild(el);
  $("log").scrollTop = $("log").scrollHeight;
  return el;
}

function note(el, text) {
  const n = document.createElement("span");
  n.className = "note";
  n.textContent = text;
  el.appendChild(n);
}

function params() {
  return {
    temperature: Number($("temperature").value),
    max_tokens: Math.round(Number($("max-tokens").value)),
    top_p: Number($("top-p").value),
  };
}

function canSend(text) {
  return !current && socket && socket.readyState === WebSocket.OPEN && text.trim() !== "";
}

function send(text) {
  const user = { role: "user", content: text };
  bubble("user", text);
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...conversation, user);
  current = { id: "g" + (++counter), el: bubble("assistant", ""), text: "", user };
  current.el.dataset.state = "streaming";
  socket.send(JSON.stringify({ type: "generate", id: current.id, messages, params: params() }));
  $("send").disabled = true;
  $("stop").disabled = false;
}

// Close the current turn: keep it in the conversation unless it failed.
function end(state, detail) {
  const turn = current;
  current = null;
  turn.el.dataset.state = state;
  if (state === "error") {
    turn.el.classList.add("error");
    note(turn.el, "error: " + detail);
  } else {
    conversation.push(turn.user, { role: "assistant", content: turn.text });
    if (detail) note(turn.el, detail);
  }
  $("send").disabled = false;
  $("stop").disabled = true;
  $("input").focus();
}

function onMessage(m) {
  if (m.type === "error" && (!current || m.id !== current.id)) {
    console.warn("zinfer:", m.code, m.message);
    return;
  }
  if (!current || m.id !== current.id) return;
  if (m.type === "delta" && m.index === 0) {
    current.text += m.text;
    current.el.querySelector(".text").textContent = current.text;
    $("log").scrollTop = $("log").scrollHeight;
  } else if (m.type === "done") {
    end("done", m.finish_reason === "length" ? "(max tokens reached)" : "");
  } else if (m.type === "cancelled") {
    end("cancelled", "(stopped)");
  } else if (m.type === "error") {
    end("error", m.message);
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value;
  if (!canSend(text)) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => {
  if (current && socket) socket.send(JSON.stringify({ type: "cancel", id: current.id }));
});
$("new-chat").addEventListener("click", () => {
  if (current) return;
  conversation.length = 0;
  $("log").replaceChildren();
});
connect();
