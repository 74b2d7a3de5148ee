// The page's DOM: message bubbles (answer markdown, speed line, actions) and the chat list.
// What the buttons do comes from chat.js as `actions`; this file only draws.
import { copyButton, renderMarkdown } from "./render.js";

export const $ = (id) => document.getElementById(id);
const bubbles = new WeakMap();  // message object -> its element on the page now

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(label, className, onClick, title) {
  const b = el("button", className, label);
  b.type = "button";
  if (title) b.title = title;
  b.addEventListener("click", onClick);
  return b;
}

// "0.21 s to first token · 38.4 tok/s · 16 tokens · prompt 31 (12 cached)"
export function statsLine(s) {
  const parts = [];
  if (s.ttft_ms != null) parts.push(`${(s.ttft_ms / 1000).toFixed(2)} s to first token`);
  if (s.tps != null) parts.push(`${s.tps.toFixed(1)} tok/s`);
  if (s.completion_tokens != null) parts.push(`${s.completion_tokens} tokens`);
  if (s.prompt_tokens != null) parts.push(`prompt ${s.prompt_tokens}` + (s.cached_tokens ? ` (${s.cached_tokens} cached)` : ""));
  return parts.join(" · ");
}

const NOTES = { cancelled: "(stopped)", interrupted: "(interrupted: the page was closed)" };

// Redraw the parts of a message that change while it streams and when it ends.
export function updateMessage(msg, actions) {
  const e = bubbles.get(msg);
  if (!e) return;
  e.dataset.state = msg.state ?? "done";
  const body = e.querySelector(".body");
  if (msg.role === "assistant") body.replaceChildren(renderMarkdown(msg.content));
  else body.textContent = msg.content;
  const meta = e.querySelector(".meta");
  meta.replaceChildren();
  if (msg.stats) meta.append(el("span", "stats", statsLine(msg.stats)));
  const note = msg.state === "error" ? "error: " + msg.error : msg.finish_reason === "length" ? "(max tokens reached)" : NOTES[msg.state];
  if (note) meta.append(el("span", "note", note));
  e.classList.toggle("error", msg.state === "error");
  e.querySelector(".actions").replaceChildren(...(msg.state === "streaming" ? [] : actionButtons(msg, actions)));
}

function actionButtons(msg, actions) {
  if (msg.role === "user") {
    return [copyButton(() => msg.content, "Copy message"), button("Edit", "edit", () => editMessage(msg, actions), "Edit and send again")];
  }
  const out = msg.content ? [copyButton(() => msg.content, "Copy answer")] : [];
  if (actions.isLast(msg)) out.push(button("Regenerate", "regenerate", () => actions.regenerate(msg), "Answer again"));
  if (actions.traceOn() && msg.id && msg.state !== "error") {
    const a = el("a", "trace", "Trace");
    a.href = actions.traceUrl(msg.id);
    a.title = "This answer's trace (Perfetto JSON: open it at ui.perfetto.dev)";
    a.addEventListener("click", (ev) => { ev.preventDefault(); actions.downloadTrace(msg.id, a); });
    out.push(a);
  }
  return out;
}

// Turn a user bubble into an editor: Send replaces it (and everything after it).
function editMessage(msg, actions) {
  const e = bubbles.get(msg);
  const area = el("textarea", "edit-input");
  area.value = msg.content;
  area.rows = Math.min(10, msg.content.split("\n").length + 1);
  const send = () => { if (area.value.trim()) actions.resend(msg, area.value); };
  area.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
    if (ev.key === "Escape") updateMessage(msg, actions);
  });
  e.querySelector(".body").replaceChildren(area);
  e.querySelector(".actions").replaceChildren(
    button("Send", "edit-send", send), button("Cancel", "edit-cancel", () => updateMessage(msg, actions)));
  area.focus();
}

export function appendMessage(msg, actions) {
  const e = el("div", "msg " + msg.role);
  e.append(el("div", "body"), el("div", "meta"), el("div", "actions"));
  bubbles.set(msg, e);
  $("log").appendChild(e);
  updateMessage(msg, actions);
  return e;
}

export function showMessages(messages, actions) {
  $("log").replaceChildren();
  for (const m of messages) appendMessage(m, actions);
  $("empty").hidden = messages.length > 0;
  scrollToEnd(true);
}

// Follow the end of the log, unless the reader has scrolled up to read something.
export function scrollToEnd(force = false) {
  const log = $("log");
  if (force || log.scrollHeight - log.scrollTop - log.clientHeight < 120) log.scrollTop = log.scrollHeight;
}

export function showChatList(store, pick, remove) {
  const items = store.chats.filter((c) => c.messages.length > 0 || c.id === store.activeId).map((chat) => {
    const li = el("li", chat.id === store.activeId ? "active" : "");
    li.append(button(chat.title, "open", () => pick(chat.id), chat.title),
      button("×", "delete", () => remove(chat.id), "Delete this chat"));
    return li;
  });
  $("chats").replaceChildren(...items);
}
