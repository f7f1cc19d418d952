// The chat: the member's conversations (list, open, new, rename, delete), sending a
// message (with images attached or pasted) and streaming the answer into the page, stop,
// regenerate, push-to-talk (its answer spoken by the server's voice as it arrives, unless
// muted), and reading a message aloud.
// The server is the truth: the page keeps only which conversation is open and what it shows.

import { ApiError, call, events, imageUrl, readAsDataUrl } from "./api.js";
import { plainText, renderMarkdown } from "./markdown.js";
import { player } from "./player.js";
import { readAloudButton, stopReading } from "./readaloud.js";
import { PushToTalk, voiceSupport } from "./voice.js";

const STOP_GRACE_MS = 2000; // after asking the server to stop, drop the stream if it has not ended
const TITLE_CHARS = 80;
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp"]; // what the model reads
// The server's defaults ([limits] max_image_bytes and max_images, [server] max_body_bytes): it
// refuses past its own limits whatever they are; the page says so before it sends.
const MAX_IMAGE_BYTES = 2_500_000;
const MAX_IMAGES = 4;
const MAX_BODY_BYTES = 4_000_000;

const $ = (id) => document.getElementById(id);

function titleFrom(text) {
  const line = text.trim().split("\n")[0];
  return line.length > TITLE_CHARS ? `${line.slice(0, TITLE_CHARS - 1)}…` : line;
}

// One assistant answer being written into the page, repainted at most once a frame.
class AnswerView {
  constructor(article) {
    this.article = article;
    this.bubble = article.querySelector(".bubble");
    this.text = "";
    this.thoughts = null; // a thinking model's thoughts: folded, apart from the answer, never read aloud
    this.frame = 0;
    article.classList.add("streaming");
    article.setAttribute("aria-busy", "true");
  }

  add(text, onPaint) {
    this.text += text;
    if (!this.frame) {
      this.frame = requestAnimationFrame(() => {
        this.frame = 0;
        this.paint();
        onPaint();
      });
    }
  }

  think(text) {
    if (!this.thoughts) {
      const details = document.createElement("details");
      details.className = "thoughts";
      details.setAttribute("data-testid", "thoughts");
      const summary = document.createElement("summary");
      summary.textContent = "Thoughts";
      this.thoughts = document.createElement("div");
      this.thoughts.className = "thoughts-text";
      details.append(summary, this.thoughts);
      this.bubble.before(details);
    }
    this.thoughts.textContent += text; // plain text: what the model wrote, never markup
  }

  paint() {
    this.bubble.innerHTML = renderMarkdown(this.text); // escaped first: see markdown.js
  }

  end(note) {
    if (this.ended) return;
    this.ended = true;
    cancelAnimationFrame(this.frame);
    this.paint();
    this.article.classList.remove("streaming");
    this.article.removeAttribute("aria-busy");
    if (note) {
      const p = document.createElement("p");
      p.className = "message-note";
      p.textContent = note;
      this.article.append(p);
    }
  }
}

export class Chat {
  constructor({ notify, closeDrawer }) {
    this.notify = notify;
    this.closeDrawer = closeDrawer;
    this.conversations = [];
    this.current = null; // {id, title}
    this.busy = null; // {kind: "chat" | "voice", conversationId, controller, view, stopping}
    this.ui = {
      list: $("conversation-list"), title: $("chat-title"), messages: $("messages"), hint: $("empty-hint"),
      input: $("message-input"), send: $("send"), stop: $("stop"), mic: $("mic"), rename: $("rename"),
      del: $("delete"), renameForm: $("rename-form"), renameInput: $("rename-input"), readAloud: $("read-aloud"),
      mute: $("mute"), attach: $("attach"), attachInput: $("attach-input"), attachments: $("attachments"),
    };
    this.pending = []; // the images to send with the next message: {name, url (a data URL), size}
    this.muted = localStorage.getItem("homeai.muted") === "1"; // push-to-talk answers in words only
    this.serverVoice = true; // until the server says it has no speech synthesis
    this.voice = new PushToTalk(this.voiceHandlers());
    this.wire();
  }

  wire() {
    const ui = this.ui;
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    ui.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      }
    });
    ui.input.addEventListener("input", () => this.autosize());
    ui.input.addEventListener("paste", (e) => {
      const files = [...((e.clipboardData && e.clipboardData.files) || [])];
      if (!files.length) return; // words paste as words
      e.preventDefault();
      this.addImages(files);
    });
    ui.attach.addEventListener("click", () => ui.attachInput.click());
    ui.attachInput.addEventListener("change", () => {
      this.addImages([...ui.attachInput.files]);
      ui.attachInput.value = "";
    });
    ui.stop.addEventListener("click", () => this.stop());
    $("new-chat").addEventListener("click", () => this.newChat());
    ui.rename.addEventListener("click", () => this.startRename());
    ui.renameForm.addEventListener("submit", (e) => {
      e.preventDefault();
      this.finishRename();
    });
    $("rename-cancel").addEventListener("click", () => this.cancelRename());
    ui.renameInput.addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        e.stopPropagation();
        this.cancelRename();
      }
    });
    ui.del.addEventListener("click", () => this.deleteClicked());
    ui.readAloud.checked = localStorage.getItem("homeai.readAloud") === "1";
    ui.readAloud.addEventListener("change", () => {
      localStorage.setItem("homeai.readAloud", ui.readAloud.checked ? "1" : "0");
      if (!ui.readAloud.checked && window.speechSynthesis) speechSynthesis.cancel();
    });
    this.wireMic();
    this.showMuted();
    ui.mute.addEventListener("click", () => {
      this.muted = !this.muted;
      localStorage.setItem("homeai.muted", this.muted ? "1" : "0");
      this.showMuted();
      if (this.muted) this.silence();
    });
  }

  showMuted() {
    this.ui.mute.setAttribute("aria-pressed", String(this.muted));
    this.ui.mute.title = this.muted ? "Spoken answers are muted" : "Mute spoken answers";
  }

  // Stop whatever is being played (a spoken answer or a message read aloud).
  silence() {
    stopReading();
    player.stop();
  }

  // ---- conversations ----------------------------------------------------------------

  async loadList() {
    this.conversations = (await call("GET", "/api/conversations")).data;
    this.renderList();
  }

  renderList() {
    const items = this.conversations.map((c) => {
      const li = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "conversation";
      button.textContent = c.title;
      button.title = c.title;
      button.dataset.id = c.id;
      if (this.current && this.current.id === c.id) button.setAttribute("aria-current", "page");
      button.addEventListener("click", () => this.open(c.id));
      li.append(button);
      return li;
    });
    if (!items.length) {
      const li = document.createElement("li");
      li.className = "muted small list-empty";
      li.textContent = "No conversations yet.";
      items.push(li);
    }
    this.ui.list.replaceChildren(...items);
  }

  async open(id, { fromHash = false } = {}) {
    this.closeDrawer();
    if (this.busy) this.stop();
    let conversation;
    try {
      conversation = await call("GET", `/api/conversations/${id}`);
    } catch (e) {
      if (e.status === 404) {
        this.notify("That conversation is gone.");
        this.newChat();
        return;
      }
      throw e;
    }
    this.show(conversation);
    if (!fromHash) history.replaceState(null, "", `#c/${conversation.id}`);
    this.ui.input.focus();
  }

  show(conversation) {
    this.current = { id: conversation.id, title: conversation.title };
    this.cancelRename();
    this.ui.title.textContent = conversation.title;
    this.ui.rename.hidden = this.ui.del.hidden = false;
    this.resetDelete();
    this.ui.messages.replaceChildren(...conversation.messages.map((m) => this.messageNode(m)));
    this.ui.hint.hidden = conversation.messages.length > 0;
    this.ui.messages.prepend(this.ui.hint);
    this.renderList();
    this.updateActions();
    this.scrollToEnd(true);
  }

  newChat() {
    this.closeDrawer();
    if (this.busy) this.stop();
    this.current = null;
    this.cancelRename();
    this.ui.title.textContent = "New chat";
    this.ui.rename.hidden = this.ui.del.hidden = true;
    this.ui.hint.hidden = false;
    this.ui.messages.replaceChildren(this.ui.hint);
    history.replaceState(null, "", location.pathname);
    this.renderList();
    this.ui.input.focus();
  }

  async ensureConversation(title) {
    if (this.current) return this.current;
    const created = await call("POST", "/api/conversations", { title });
    this.current = { id: created.id, title: created.title };
    this.conversations.unshift(created);
    history.replaceState(null, "", `#c/${created.id}`);
    this.ui.title.textContent = created.title;
    this.ui.rename.hidden = this.ui.del.hidden = false;
    this.renderList();
    return this.current;
  }

  startRename() {
    if (!this.current) return;
    this.ui.renameInput.value = this.current.title;
    this.ui.renameForm.hidden = false;
    this.ui.title.hidden = true;
    this.ui.renameInput.select();
    this.ui.renameInput.focus();
  }

  async finishRename() {
    const title = this.ui.renameInput.value.trim();
    if (!title || !this.current) return this.cancelRename();
    try {
      const renamed = await call("PATCH", `/api/conversations/${this.current.id}`, { title });
      this.current.title = renamed.title;
      this.ui.title.textContent = renamed.title;
      await this.loadList();
    } catch (e) {
      this.notify(e.message);
    }
    this.cancelRename();
    this.ui.rename.focus();
  }

  cancelRename() {
    this.ui.renameForm.hidden = true;
    this.ui.title.hidden = false;
  }

  // Delete asks once more on the same button (no modal): a second press within 4 s deletes.
  async deleteClicked() {
    if (!this.current) return;
    if (!this.deleteArmed) {
      this.deleteArmed = setTimeout(() => this.resetDelete(), 4000);
      this.ui.del.textContent = "Really delete?";
      this.ui.del.classList.add("armed");
      return;
    }
    this.resetDelete();
    const id = this.current.id;
    if (this.busy) this.stop();
    try {
      await call("DELETE", `/api/conversations/${id}`);
    } catch (e) {
      if (e.status !== 404) return this.notify(e.message);
    }
    this.conversations = this.conversations.filter((c) => c.id !== id);
    this.newChat();
    this.notify("Conversation deleted.");
  }

  resetDelete() {
    clearTimeout(this.deleteArmed);
    this.deleteArmed = null;
    this.ui.del.textContent = "Delete";
    this.ui.del.classList.remove("armed");
  }

  // ---- images to send ---------------------------------------------------------------

  async addImages(files) {
    for (const file of files) {
      const why = this.refusal(file);
      if (why) {
        this.notify(why);
        continue;
      }
      const image = { name: file.name || "the pasted image", size: file.size, url: "" };
      this.pending.push(image); // counted at once: a second file is checked against this one
      try {
        image.url = await readAsDataUrl(file);
      } catch {
        this.pending = this.pending.filter((p) => p !== image);
        this.notify(`${image.name} could not be read.`);
      }
      this.renderAttachments();
    }
  }

  // Why `file` cannot go with the message, or "".
  refusal(file) {
    const name = file.name || "The pasted file";
    if (!IMAGE_TYPES.includes(file.type)) return `${name} is not an image homeai reads (PNG, JPEG, WebP, GIF or BMP).`;
    if (file.size > MAX_IMAGE_BYTES) return `${name} is too large (${megabytes(file.size)}): at most ${megabytes(MAX_IMAGE_BYTES)} an image.`;
    if (this.pending.length >= MAX_IMAGES) return `At most ${MAX_IMAGES} images can go with one message.`;
    const total = this.pending.reduce((sum, p) => sum + p.size, file.size);
    if ((total * 4) / 3 > MAX_BODY_BYTES * 0.95) return `${name} would make the message too large to send: send fewer images at once.`;
    return "";
  }

  renderAttachments() {
    const chips = this.pending.filter((p) => p.url).map((image) => {
      const chip = document.createElement("div");
      chip.className = "chip";
      chip.setAttribute("data-testid", "attachment");
      const img = document.createElement("img");
      img.src = image.url;
      img.alt = image.name;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "chip-remove";
      remove.setAttribute("aria-label", `Remove ${image.name}`);
      remove.textContent = "×";
      remove.addEventListener("click", () => {
        this.pending = this.pending.filter((p) => p !== image);
        this.renderAttachments();
        this.ui.input.focus();
      });
      chip.append(img, remove);
      return chip;
    });
    this.ui.attachments.replaceChildren(...chips);
    this.ui.attachments.hidden = !chips.length;
  }

  // ---- messages ---------------------------------------------------------------------

  messageNode(message) {
    const article = document.createElement("article");
    article.className = `message ${message.role}`;
    if (message.id) article.dataset.id = message.id;
    const who = document.createElement("span");
    who.className = "sr-only";
    who.textContent = message.role === "user" ? "You said:" : "homeai said:";
    const bubble = document.createElement("div");
    bubble.className = "bubble";
    if (message.role === "assistant") {
      article.setAttribute("data-testid", "assistant-message");
      bubble.innerHTML = renderMarkdown(message.content); // escaped first: see markdown.js
    } else {
      bubble.textContent = message.content;
    }
    const read = readAloudButton(() => bubble.innerText, this.notify);
    article.append(who, ...this.imagesNode(message), bubble, read);
    return article;
  }

  // A message's images: sent from this page ({src}, a data URL), or stored ({url}, fetched with the token).
  imagesNode(message) {
    if (!message.images || !message.images.length) return [];
    const box = document.createElement("div");
    box.className = "message-images";
    for (const image of message.images) {
      const img = document.createElement("img");
      img.alt = "An image sent with the message";
      img.setAttribute("data-testid", "message-image");
      if (image.src) img.src = image.src;
      else {
        imageUrl(image.url).then((url) => (img.src = url)).catch(() => (img.alt = "The image could not be loaded."));
      }
      box.append(img);
    }
    return [box];
  }

  append(message) {
    this.ui.hint.hidden = true;
    const node = this.messageNode(message);
    this.ui.messages.append(node);
    this.scrollToEnd(true);
    return node;
  }

  scrollToEnd(force = false) {
    const box = this.ui.messages;
    if (force || box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
  }

  // Regenerate sits on the last answer (or "Answer" under a question left without one).
  updateActions() {
    this.ui.messages.querySelectorAll(".message-actions").forEach((n) => n.remove());
    const last = this.ui.messages.querySelector(".message:last-of-type");
    if (this.busy || !this.current || !last) return;
    const bar = document.createElement("div");
    bar.className = "message-actions";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "quiet small";
    button.textContent = last.classList.contains("assistant") ? "↻ Regenerate" : "Answer";
    button.addEventListener("click", () => this.regenerate());
    bar.append(button);
    last.append(bar);
  }

  autosize() {
    const input = this.ui.input;
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight, window.innerHeight * 0.4)}px`;
  }

  setBusy(busy) {
    this.busy = busy;
    this.ui.send.hidden = Boolean(busy);
    this.ui.stop.hidden = !busy;
    this.ui.stop.disabled = false;
    this.ui.mic.disabled = Boolean(busy && busy.kind !== "voice") || Boolean(voiceSupport());
    this.updateActions();
  }

  // ---- sending and streaming --------------------------------------------------------

  async send() {
    const text = this.ui.input.value.trim();
    if (this.busy) return;
    if (this.pending.some((p) => !p.url)) return this.notify("The image is still being read.");
    if (!text) {
      if (this.pending.length) this.notify("Ask something about the image too.");
      return;
    }
    const images = this.pending;
    const giveBack = () => {
      this.ui.input.value = text;
      this.pending = images;
      this.renderAttachments();
      this.autosize();
    };
    this.ui.input.value = "";
    this.pending = [];
    this.renderAttachments();
    this.autosize();
    try {
      await this.ensureConversation(titleFrom(text));
    } catch (e) {
      giveBack();
      this.notify(e.message);
      return;
    }
    const question = this.append({ role: "user", content: text, images: images.map((p) => ({ src: p.url })) });
    const body = images.length ? { content: text, images: images.map((p) => p.url) } : { content: text };
    const { started } = await this.stream(`/api/conversations/${this.current.id}/messages`, body, question);
    if (!started) {
      question.remove(); // never stored: give the words and images back to try again
      giveBack();
    }
  }

  async regenerate() {
    if (this.busy || !this.current) return;
    const id = this.current.id;
    const last = this.ui.messages.querySelector(".message:last-of-type");
    const old = last && last.classList.contains("assistant") ? last : null;
    if (old) old.hidden = true;
    const { started, done } = await this.stream(`/api/conversations/${id}/regenerate`, {}, null);
    if (done && done.message) {
      if (old) old.remove(); // the server replaced it
    } else if (started && this.current && this.current.id === id) {
      await this.open(id); // ended without a clear outcome: show what the server kept
    } else if (old) {
      old.hidden = false;
    }
    this.updateActions();
  }

  // Stream one answer into a new message: whether the server took the request, and its last event.
  async stream(path, body, question) {
    speechStop();
    const conversationId = this.current.id;
    const controller = new AbortController();
    const view = new AnswerView(this.append({ role: "assistant", content: "" }));
    this.setBusy({ kind: "chat", conversationId, controller, view });
    let done = null;
    let started = false;
    try {
      for await (const event of events(path, body, { signal: controller.signal })) {
        started = true;
        if (event.type === "message.user" && question) question.dataset.id = event.message.id;
        else if (event.type === "response.thinking") view.think(event.text);
        else if (event.type === "response.delta") view.add(event.text, () => this.scrollToEnd());
        else if (event.type === "response.done") done = event;
        else if (event.type === "error") throw new ApiError(500, event);
      }
      this.finishAnswer(view, done);
    } catch (e) {
      started = started || view.text.length > 0;
      if (e.name === "AbortError") view.end(view.text ? "Stopped." : "");
      else {
        view.end();
        this.notify(e.message);
      }
      if (!view.text && !view.thoughts) view.article.remove();
    } finally {
      clearTimeout(this.busy && this.busy.abortTimer);
      this.setBusy(null);
      this.loadList().catch(() => {});
    }
    return { started, done };
  }

  finishAnswer(view, done) {
    const stopped = !done || done.finish_reason === "abort";
    view.end(stopped ? "Stopped." : done.finish_reason === "length" ? "Cut short: the length limit was reached." : "");
    if (done && done.message) {
      view.article.dataset.id = done.message.id;
    } else if (!view.text && !view.thoughts) {
      view.article.remove();
    }
    if (!stopped) speak(view.text, this.ui.readAloud.checked);
  }

  // Ask the server to abort the sequence; the stream then ends with finish_reason "abort".
  // If it has not ended shortly after, drop the connection (which aborts it too).
  stop() {
    const busy = this.busy;
    if (!busy || busy.stopping) return;
    busy.stopping = true;
    this.ui.stop.disabled = true;
    speechStop();
    if (busy.kind === "voice") {
      this.silence();
      this.voice.cancel();
      return;
    }
    call("POST", `/api/conversations/${busy.conversationId}/stop`).catch(() => busy.controller.abort());
    busy.abortTimer = setTimeout(() => busy.controller.abort(), STOP_GRACE_MS);
  }

  // ---- push-to-talk -----------------------------------------------------------------

  wireMic() {
    const mic = this.ui.mic;
    const why = voiceSupport();
    if (why) {
      mic.disabled = true;
      mic.title = why;
      return;
    }
    mic.title = "Hold to talk (or press Space to start and again to stop)";
    const press = (e) => {
      e.preventDefault();
      this.talk();
    };
    const release = () => this.endTalk();
    mic.addEventListener("pointerdown", press);
    mic.addEventListener("pointerup", release);
    mic.addEventListener("pointercancel", release);
    mic.addEventListener("pointerleave", release);
    mic.addEventListener("keydown", (e) => {
      if ((e.key === " " || e.key === "Enter") && !e.repeat) {
        e.preventDefault();
        if (this.talking) this.endTalk();
        else this.talk();
      }
    });
  }

  async talk() {
    if (this.talking) return;
    this.silence(); // speaking again stops playback (in the press: it also lets the page play audio)
    player.unlock();
    if (this.busy && this.busy.kind === "voice") this.interrupt();
    if (this.busy) return;
    this.talking = true;
    try {
      const fresh = !this.current;
      await this.ensureConversation("Voice chat");
      this.voiceFresh = fresh;
      this.setBusy({ kind: "voice", conversationId: this.current.id, view: null });
      await this.voice.start(this.current.id, { speak: !this.muted && this.serverVoice });
      if (!this.talking) {
        this.voice.close(); // let go before the microphone opened: nothing to send
        this.notify("Hold the button while you speak.");
      }
    } catch (e) {
      this.talking = false;
      this.voice.close();
      this.setBusy(null);
      this.notify(e.name === "NotAllowedError" ? "The microphone was not allowed." : e.message);
    }
  }

  // Barge-in: the member speaks while the last answer is still coming; it stops where it is.
  interrupt() {
    const view = this.busy.view;
    this.voice.abandon();
    if (view) {
      view.end("Stopped.");
      if (!view.text) view.article.remove();
    }
    this.setBusy(null);
  }

  endTalk() {
    if (!this.talking) return;
    this.talking = false;
    if (this.voice.recording) this.voice.stop();
  }

  voiceHandlers() {
    return {
      transcript: (text) => {
        if (!this.busy || this.busy.kind !== "voice") return;
        this.append({ role: "user", content: text });
        this.busy.view = new AnswerView(this.append({ role: "assistant", content: "" }));
        if (this.voiceFresh && text.trim()) {
          this.voiceFresh = false;
          call("PATCH", `/api/conversations/${this.current.id}`, { title: titleFrom(text) })
            .then((c) => {
              if (this.current && this.current.id === c.id) this.ui.title.textContent = this.current.title = c.title;
            })
            .catch(() => {});
        }
      },
      delta: (text) => {
        if (this.busy && this.busy.view) this.busy.view.add(text, () => this.scrollToEnd());
      },
      done: (event) => {
        if (!this.busy || !this.busy.view) return;
        const complete = event.finish_reason === "stop" || event.finish_reason === "length";
        this.busy.view.end(complete ? "" : "Stopped.");
        const spoken = this.busy.spoken; // by the server's voice: not again by the browser's
        if (complete && !spoken && !this.muted) speak(event.text || this.busy.view.text, this.ui.readAloud.checked);
      },
      audioStart: (sampleRate) => {
        if (!this.busy || this.busy.kind !== "voice") return;
        this.busy.spoken = true;
        stopReading();
        player.begin(sampleRate);
      },
      audio: (frame) => {
        if (this.busy && this.busy.kind === "voice" && !this.busy.stopping && !this.muted) player.push(frame);
      },
      audioDone: (event) => {
        if (event.error) this.notify(`The answer could not be spoken: ${event.error.message}`);
      },
      speechUnavailable: () => {
        this.serverVoice = false; // this server has no speech synthesis: answers in words (and the browser's voice)
      },
      error: (message) => this.notify(message),
      state: (name) => {
        this.ui.mic.setAttribute("aria-pressed", String(name === "recording"));
        this.ui.mic.classList.toggle("recording", name === "recording");
        if (name === "idle" && this.busy && this.busy.kind === "voice") {
          const view = this.busy.view;
          if (view) {
            view.end(this.busy.stopping ? "Stopped." : "");
            if (!view.text) view.article.remove();
          }
          this.talking = false;
          this.setBusy(null);
          this.loadList().catch(() => {});
        }
      },
    };
  }
}

function speak(text, enabled) {
  if (!enabled || !window.speechSynthesis || !text) return;
  speechSynthesis.cancel();
  speechSynthesis.speak(new SpeechSynthesisUtterance(plainText(text)));
}

function megabytes(bytes) {
  return `${(bytes / 1_000_000).toFixed(1)} MB`;
}

function speechStop() {
  if (window.speechSynthesis) speechSynthesis.cancel();
}
