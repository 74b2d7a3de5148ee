// A Node.js host embedding zinfer as a subprocess over the stdio JSON-lines protocol
// (gateway/PROTOCOL.md), used by tests/test_stdio.py.
//
//   node stdio_client.mjs PROMPT COMMAND [ARGS...]     e.g. ... "Hi" zinfer stdio --model PATH
//
// Waits for {"type":"ready"}, then runs two requests at once: a greedy generation "g"
// and a long one "c" that it cancels after its first delta. When both have ended it
// closes zinfer's stdin and waits for it to exit. Prints one JSON summary line.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

const [prompt, command, ...args] = process.argv.slice(2);
if (!prompt || !command) {
  console.error("usage: node stdio_client.mjs PROMPT COMMAND [ARGS...]");
  process.exit(2);
}
const TERMINAL = new Set(["finished", "cancelled", "rejected", "failed", "tokenized", "stats"]);

const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve(code ?? signal)));
const send = (msg) => child.stdin.write(JSON.stringify(msg) + "\n");

const events = { g: [], c: [] };
const lines = [];
let ready = null;
const ended = new Set();
let allEnded;
const bothEnded = new Promise((resolve) => (allEnded = resolve));

createInterface({ input: child.stdout }).on("line", (line) => {
  lines.push(line);
  const ev = JSON.parse(line); // every stdout line is one JSON object
  if (ev.type === "ready") {
    ready = ev;
    const messages = [{ role: "user", content: prompt }];
    send({ type: "generate", request_id: "g", messages, params: { temperature: 0, max_tokens: 16 } });
    send({ type: "generate", request_id: "c", messages, params: { temperature: 0, max_tokens: 1000, ignore_eos: true } });
    return;
  }
  const mine = events[ev.request_id];
  if (!mine) return;
  mine.push(ev);
  if (ev.request_id === "c" && ev.type === "delta" && mine.filter((e) => e.type === "delta").length === 1) {
    send({ type: "cancel", request_id: "c" });
  }
  if (TERMINAL.has(ev.type)) {
    ended.add(ev.request_id);
    if (ended.size === 2) allEnded();
  }
});

await bothEnded;
child.stdin.end(); // EOF: zinfer exits once nothing is open
const code = await exited;
const text = events.g.filter((e) => e.type === "delta").map((e) => e.text ?? "").join("");
console.log(JSON.stringify({ summary: { ready, text, g: events.g.map((e) => e.type), c: events.c.map((e) => e.type), exit: code, lines: lines.length } }));
