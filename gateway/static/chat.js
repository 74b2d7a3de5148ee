// The zinfer chat page: talks to /v1/ws (protocol: gateway/PROTOCOL.md). Each turn sends
// the chat's history whole; chats live in this browser (store.js), answers are drawn by
// view.js and render.js.
import { Store, newId } from "./store.js";
import { renderMarkdown } from "./render.js";
import { $, scrollToEnd, showChatList, showMessages, updateMessage } from "./view.js";

const apiKey = takeApiKey();  // with `zinfer serve --api-key`: opened as /?api_key=KEY
const store = new Store();
let socket = null;
let current = null;  // the answer streaming now: {id, chat, msg, t0, tFirst}
let retryMs = 500;
let tracing = false;  // whether the server keeps per-request traces (GET v1/traces)
let frame = 0;  // a pending redraw of the streaming answer

// Read ?api_key from the address and take it out of the address bar and history, so it
// is not shown, bookmarked or shared; the page keeps it in memory for its requests.
function takeApiKey() {
  const url = new URL(location.href);
  const key = url.searchParams.get("api_key");
  if (key !== null) {
    url.searchParams.delete("api_key");
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
  }
  return key;
}

const authHeaders = () => (apiKey ? { Authorization: "Bearer " + apiKey } : {});
const api = (path) => fetch(new URL(path, location.href), { headers: authHeaders() });

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
    if (current) end("error", { error: "the connection closed" });
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 8000);
  };
}

async function loadServerInfo() {
  try {
    const models = await (await api("v1/models")).json();
    const name = models.data?.[0]?.id;
    if (name) {
      $("model").textContent = name.split("/").pop();  // a path: its file name
      $("model").title = name;
      document.title = name + " · zinfer";
    }
  } catch (e) {
    console.warn("zinfer: no model name:", e);
  }
  try {
    const r = await api("v1/traces");
    tracing = r.ok && (await r.json()).enabled === true;
  } catch {
    tracing = false;
  }
  if (tracing) showChat();
}

// ---- settings ----------------------------------------------------------------------------

const FIELDS = { temperature: "temperature", max_tokens: "max-tokens", top_p: "top-p", system: "system" };

function restoreSettings() {
  const saved = Store.loadSettings();
  for (const [key, id] of Object.entries(FIELDS)) if (saved[key] != null) $(id).value = saved[key];
  for (const id of Object.values(FIELDS)) {
    $(id).addEventListener("input", () => Store.saveSettings(Object.fromEntries(Object.entries(FIELDS).map(([k, i]) => [k, $(i).value]))));
  }
}

function params() {
  return {
    temperature: Number($("temperature").value),
    max_tokens: Math.round(Number($("max-tokens").value)),
    top_p: Number($("top-p").value),
  };
}

// What the model sees: the system prompt and the chat before `upTo`, without failed answers.
function modelMessages(chat, upTo) {
  const out = [];
  const system = $("system").value.trim();
  if (system) out.push({ role: "system", content: system });
  for (const m of chat.messages.slice(0, upTo)) {
    if (m.role === "user" || (m.content && (m.state === "done" || m.state === "cancelled" || m.state === "interrupted"))) {
      out.push({ role: m.role, content: m.content });
    }
  }
  return out;
}

// ---- turns -------------------------------------------------------------------------------

const canSend = () => !current && socket && socket.readyState === WebSocket.OPEN;

// Ask for an answer to chat as it stands: a new assistant message at its end.
function generate(chat) {
  const messages = modelMessages(chat, chat.messages.length);
  const msg = { role: "assistant", content: "", id: newId(), state: "streaming" };
  chat.messages.push(msg);
  store.touch(chat);
  current = { id: msg.id, chat, msg, t0: performance.now(), tFirst: null };
  socket.send(JSON.stringify({ type: "generate", id: msg.id, messages, params: params() }));
  showChat();
  setBusy(true);
}

function sendNew(text) {
  const chat = store.activeOrNew();
  chat.messages.push({ role: "user", content: text });
  generate(chat);
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

// Close the current answer with its end state and what the server said about it.
function end(state, extra = {}) {
  const turn = current;
  current = null;
  cancelAnimationFrame(frame);
  Object.assign(turn.msg, { state }, extra);
  store.touch(turn.chat);
  if (turn.chat === store.active) showChat();  // the regenerate button moves to the new last answer
  setBusy(false);
  if (window.matchMedia("(pointer: fine)").matches) $("input").focus();
}

// Time to first token, and decode speed: tokens after the first over the time after it.
function stats(turn, usage) {
  const now = performance.now();
  const n = usage?.completion_tokens;
  const s = { ...usage, total_ms: now - turn.t0 };
  if (turn.tFirst != null) {
    s.ttft_ms = turn.tFirst - turn.t0;
    if (n > 1 && now > turn.tFirst) s.tps = (n - 1) / ((now - turn.tFirst) / 1000);
  }
  return s;
}

function onMessage(m) {
  if (!current || m.id !== current.id) {
    if (m.type === "error") console.warn("zinfer:", m.code, m.message);
    return;
  }
  if (m.type === "delta" && !m.index) {
    if (m.text && current.tFirst == null) current.tFirst = performance.now();
    current.msg.content += m.text ?? "";
    if (!frame) frame = requestAnimationFrame(redraw);
  } else if (m.type === "done") {
    end("done", { stats: stats(current, m.usage), finish_reason: m.finish_reason });
  } else if (m.type === "cancelled") {
    end("cancelled", { stats: stats(current, m.usage) });
  } else if (m.type === "error") {
    end("error", { error: m.message });
  }
}

function redraw() {
  frame = 0;
  if (current && current.chat === store.active) {
    updateMessage(current.msg, actions);
    scrollToEnd();
  }
}

// ---- what the buttons do ------------------------------------------------------------------

const actions = {
  isLast: (msg) => store.active?.messages.at(-1) === msg,
  traceOn: () => tracing,
  traceUrl: (id) => new URL("v1/traces/" + encodeURIComponent(id), location.href).href,
  regenerate(msg) {
    const chat = store.active;
    if (!canSend() || chat.messages.at(-1) !== msg) return;
    chat.messages.pop();
    generate(chat);
  },
  resend(msg, text) {
    const chat = store.active;
    const i = chat.messages.indexOf(msg);
    if (!canSend() || i < 0) return;
    chat.messages.splice(i, chat.messages.length - i, { role: "user", content: text });
    generate(chat);
  },
  async downloadTrace(id, link) {
    const r = await fetch(actions.traceUrl(id), { headers: authHeaders() });
    if (!r.ok) {
      link.textContent = "Trace: " + ((await r.json().catch(() => null))?.error?.message ?? r.status);
      return;
    }
    const a = document.createElement("a");
    a.href = URL.createObjectURL(await r.blob());
    a.download = `zinfer-trace-${id}.json`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  },
};

function showChat() {
  showMessages(store.active?.messages ?? [], actions);
  showChatList(store, pickChat, removeChat);
}

function pickChat(id) {
  store.activeId = id;
  document.body.classList.remove("sidebar-open");
  showChat();
}

function removeChat(id) {
  if (current && current.chat.id === id) return;  // stop its answer first
  store.remove(id);
  showChat();
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value;
  if (!canSend() || text.trim() === "") return;
  $("input").value = "";
  $("input").style.height = "";
  sendNew(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("input").addEventListener("input", () => {  // grow with the text, up to a third of the screen
  $("input").style.height = "";
  $("input").style.height = Math.min($("input").scrollHeight + 2, innerHeight / 3) + "px";
});
$("stop").addEventListener("click", () => {
  if (current && socket) socket.send(JSON.stringify({ type: "cancel", id: current.id }));
});
$("new-chat").addEventListener("click", () => {
  if (!store.active || store.active.messages.length > 0) store.create();
  document.body.classList.remove("sidebar-open");
  showChat();
  $("input").focus();
});
window.addEventListener("storage", (e) => {  // another tab saved its chats: show them, unless we are answering
  if (Store.changedElsewhere(e) && !current) {
    store.reload();
    showChat();
  }
});
$("menu").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));
$("scrim").addEventListener("click", () => document.body.classList.remove("sidebar-open"));

// For tests and the console: the page's state and its renderer.
window.zinfer = { store, renderMarkdown, get current() { return current; } };

restoreSettings();
showChat();
connect();
loadServerInfo();
