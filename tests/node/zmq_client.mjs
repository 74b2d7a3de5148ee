// A Node.js client of zinfer's ZeroMQ protocol (gateway/PROTOCOL.md), used by tests/test_node_clients.py.
//
//   node zmq_client.mjs ENDPOINT PROMPT [MAX_TOKENS]
//
// 1. sends a greedy chat generate for PROMPT and streams its text to stderr;
// 2. sends a long generate and cancels it after its first delta.
// Every event received is printed to stdout as one JSON line; at the end a summary
// line {"summary": {...}} follows. Exit status 0 when both requests ended.
import { Dealer } from "zeromq";
import { encode, decode } from "@msgpack/msgpack";

const [endpoint, prompt, maxTokens = "16"] = process.argv.slice(2);
if (!endpoint || !prompt) {
  console.error("usage: node zmq_client.mjs ENDPOINT PROMPT [MAX_TOKENS]");
  process.exit(2);
}
const TERMINAL = new Set(["finished", "cancelled", "rejected", "failed", "tokenized", "stats"]);

const sock = new Dealer({ linger: 0, receiveTimeout: 120000 });
sock.connect(endpoint);

// One request = one frame: a msgpack map with a "type" tag (never an array).
async function request(msg) {
  await sock.send(encode(msg));
}

// The next event (one frame, a msgpack map), printed as a JSON line.
async function nextEvent() {
  const [frame] = await sock.receive();
  const event = decode(frame);
  process.stdout.write(JSON.stringify(event) + "\n");
  return event;
}

// Read events until `id` ends; `onEvent` sees each of that request's events.
async function untilTerminal(id, onEvent = () => {}) {
  const events = [];
  for (;;) {
    const ev = await nextEvent();
    if (ev.request_id !== id) continue;
    events.push(ev);
    await onEvent(ev);
    if (TERMINAL.has(ev.type)) return events;
  }
}

const messages = [{ role: "user", content: prompt }];

await request({ type: "generate", request_id: "node-1", messages, params: { temperature: 0.0, max_tokens: Number(maxTokens) } });
let text = "";
const first = await untilTerminal("node-1", (ev) => {
  if (ev.type === "delta") {
    const piece = ev.text ?? ""; // fields at their default value are left out of the map
    text += piece;
    process.stderr.write(piece);
  }
});
process.stderr.write("\n");

await request({ type: "generate", request_id: "node-2", messages, params: { temperature: 0.0, max_tokens: 1000, ignore_eos: true } });
let cancelSent = false;
const second = await untilTerminal("node-2", async (ev) => {
  if (ev.type === "delta" && !cancelSent) {
    cancelSent = true;
    await request({ type: "cancel", request_id: "node-2" });
  }
});

// Anything more for node-2 would break "exactly one terminal": ask for stats and read up to its reply.
await request({ type: "stats", request_id: "node-3" });
const after = (await untilTerminal("node-3")).at(-1);

process.stdout.write(JSON.stringify({ summary: { text, first: first.at(-1), second: second.map((e) => e.type), open_requests: after.open_requests ?? 0 } }) + "\n");
sock.close();
