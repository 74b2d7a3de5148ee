// Conversations and settings kept in this browser (localStorage), so a reload or a closed
// tab loses nothing. One key holds every chat: [{id, title, updated, messages}], newest
// first; a message is {role, content} plus, on answers, {id, state, stats, error}.

const CHATS = "zinfer.chats.v1";
const SETTINGS = "zinfer.settings.v1";

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;  // unreadable (edited by hand, another version): start afresh
  }
}

function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    console.warn("zinfer: could not keep the conversations in this browser:", e);
  }
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export class Store {
  constructor() {
    this.activeId = null;
    this.reload();
  }

  // Read the chats again (another tab of this page changed them); the chat shown stays if it is still there.
  reload() {
    this.chats = read(CHATS, []).filter((c) => c && Array.isArray(c.messages));
    for (const chat of this.chats) {
      for (const m of chat.messages) {
        if (m.state === "streaming") m.state = "interrupted";  // the page closed mid-answer
      }
    }
    if (!this.active) this.activeId = this.chats[0]?.id ?? null;
  }

  static changedElsewhere(event) {
    return event.key === CHATS;
  }

  get active() {
    return this.chats.find((c) => c.id === this.activeId) ?? null;
  }

  // The chat shown now; made (and kept) on first use.
  activeOrNew() {
    return this.active ?? this.create();
  }

  create() {
    const chat = { id: newId(), title: "New chat", updated: Date.now(), messages: [] };
    this.chats.unshift(chat);
    this.activeId = chat.id;
    return chat;
  }

  remove(id) {
    this.chats = this.chats.filter((c) => c.id !== id);
    if (this.activeId === id) this.activeId = this.chats[0]?.id ?? null;
    this.save();
  }

  // Mark chat as changed now: it moves to the top of the list, and is written out.
  touch(chat) {
    chat.updated = Date.now();
    const first = chat.messages.find((m) => m.role === "user");
    if (first) chat.title = first.content.trim().split("\n")[0].slice(0, 60) || "New chat";
    this.chats.sort((a, b) => b.updated - a.updated);
    this.save();
  }

  save() {
    write(CHATS, this.chats.filter((c) => c.messages.length > 0));
  }

  static loadSettings() {
    return read(SETTINGS, {});
  }

  static saveSettings(settings) {
    write(SETTINGS, settings);
  }
}

export { newId };
