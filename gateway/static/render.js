// Markdown of a model's answer -> safe DOM: marked parses, DOMPurify sanitizes, highlight.js
// colours code blocks. The libraries are the classic scripts in static/vendor/ (globals).
//
// A model's answer is untrusted text. Raw HTML in it is shown as text, not interpreted
// (the renderer escapes it), and DOMPurify then removes whatever could still run or
// reach out: scripts, event handlers, javascript: links, styles, images and forms (an
// image URL could carry the conversation to another site).
/* global marked, DOMPurify, hljs */

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ESCAPES[c]);

marked.use({ gfm: true, renderer: { html: ({ text }) => escapeHtml(text) } });

const PURIFY = {
  FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select",
    "iframe", "object", "embed", "video", "audio", "source", "picture", "link", "meta", "base"],
  FORBID_ATTR: ["style", "id", "name"],
  RETURN_DOM_FRAGMENT: true,
};

// Classes only on code, naming its language (marked's `language-xxx`); links open elsewhere.
DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  if (data.attrName === "class" && !(node.nodeName === "CODE" && /^language-[\w+#.-]+$/.test(data.attrValue))) {
    data.keepAttr = false;
  }
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// Copy text to the clipboard and say so on the button ("Copied" for a moment).
export async function copyText(text, button) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    const area = document.createElement("textarea");  // without clipboard access (plain http)
    area.value = text;
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    ok = document.execCommand("copy");
    area.remove();
  }
  if (button) {
    const label = button.dataset.label ?? button.textContent;
    button.dataset.label = label;
    button.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => { button.textContent = label; }, 1500);
  }
  return ok;
}

export function copyButton(getText, title = "Copy") {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "copy";
  b.textContent = "Copy";
  b.title = title;
  b.addEventListener("click", () => copyText(getText(), b));
  return b;
}

// Colour one <pre><code> and put it in a frame with its language and a copy button.
function frameCode(code) {
  const source = code.textContent;
  const lang = /language-([\w+#.-]+)/.exec(code.className)?.[1];
  const known = lang && hljs.getLanguage(lang);
  // guessing the language of a long unlabelled block costs too much on every redraw of a stream
  const result = known ? hljs.highlight(source, { language: lang, ignoreIllegals: true })
    : source.length <= 20000 ? hljs.highlightAuto(source) : { value: escapeHtml(source), language: null };
  code.innerHTML = result.value;  // highlight.js escapes the text it wraps in its spans
  code.classList.add("hljs");
  const pre = code.parentElement;
  const frame = document.createElement("div");
  frame.className = "code";
  const head = document.createElement("div");
  head.className = "code-head";
  const name = document.createElement("span");
  name.textContent = lang || result.language || "text";
  head.append(name, copyButton(() => source, "Copy code"));
  pre.replaceWith(frame);
  frame.append(head, pre);
}

// The answer's markdown as a DocumentFragment ready to insert.
export function renderMarkdown(text) {
  const fragment = DOMPurify.sanitize(marked.parse(text, { async: false }), PURIFY);
  for (const code of fragment.querySelectorAll("pre > code")) frameCode(code);
  return fragment;
}
