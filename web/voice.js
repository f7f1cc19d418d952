// Push-to-talk over the WebSocket /v1/voice: the microphone as PCM16 mono 16 kHz frames,
// `audio.end` when the member lets go; the server answers with `transcript.final`, then
// `response.delta`s and `response.done` (or `error`). One socket per utterance.

import { token } from "./api.js";

const SAMPLE_RATE = 16000;

export function voiceSupport() {
  if (!window.isSecureContext) return "The microphone needs https or localhost";
  if (!navigator.mediaDevices || !window.AudioWorkletNode || !window.WebSocket) return "This browser cannot record";
  return null;
}

export class PushToTalk {
  // handlers: {transcript(text), delta(text), done(event), error(message), state(name)}
  constructor(handlers) {
    this.on = handlers;
    this.socket = null;
    this.audio = null;
    this.pending = []; // frames recorded before the socket opened
  }

  get recording() {
    return this.audio !== null;
  }

  async start(conversationId) {
    if (this.audio || this.socket) return;
    const media = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    const context = new AudioContext();
    if (context.state === "suspended") await context.resume();
    await context.audioWorklet.addModule("/pcm-worklet.js");
    const node = new AudioWorkletNode(context, "pcm16", { processorOptions: { targetRate: SAMPLE_RATE } });
    const silent = context.createGain(); // keeps the graph pulled without playing the microphone back
    silent.gain.value = 0;
    context.createMediaStreamSource(media).connect(node).connect(silent).connect(context.destination);
    node.port.onmessage = (e) => this.frame(e.data);
    this.audio = { media, context, node };
    this.open(conversationId);
    this.on.state("recording");
  }

  open(conversationId) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/v1/voice`);
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      const start = { type: "session.start", sample_rate: SAMPLE_RATE, conversation_id: conversationId };
      if (token.get()) start.token = token.get();
      socket.send(JSON.stringify(start));
      for (const item of this.pending) socket.send(item);
      this.pending = [];
    };
    socket.onmessage = (e) => this.message(e.data);
    socket.onerror = () => this.on.error("The voice connection failed");
    socket.onclose = (e) => {
      if (this.socket === socket) this.socket = null;
      if (e.code === 4401) this.on.error("Sign in again to talk");
      this.release();
      this.on.state("idle");
    };
    this.socket = socket;
  }

  frame(data) {
    if (data === "flushed") {
      this.send(JSON.stringify({ type: "audio.end" }));
      this.release();
      return;
    }
    this.send(data);
  }

  send(item) {
    if (!this.socket) return;
    if (this.socket.readyState === WebSocket.OPEN) this.socket.send(item);
    else if (this.socket.readyState === WebSocket.CONNECTING) this.pending.push(item);
  }

  // The member let go: flush the last samples, then `audio.end`; the answer follows.
  stop() {
    if (!this.audio) return;
    this.audio.media.getTracks().forEach((t) => t.stop());
    this.audio.node.port.postMessage("flush");
    this.on.state("thinking");
  }

  // Stop the answer in progress (the server aborts its sequence).
  cancel() {
    this.send(JSON.stringify({ type: "response.cancel" }));
    this.close();
  }

  close() {
    if (this.socket) this.socket.close();
    this.socket = null;
    this.release();
  }

  release() {
    if (!this.audio) return;
    this.audio.media.getTracks().forEach((t) => t.stop());
    this.audio.context.close().catch(() => {});
    this.audio = null;
  }

  message(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    if (event.type === "transcript.final") this.on.transcript(event.text || "");
    else if (event.type === "response.delta") this.on.delta(event.text || "");
    else if (event.type === "response.done") {
      this.on.done(event);
      this.close();
    } else if (event.type === "error") {
      this.on.error(event.message || event.code || "Voice error");
      if (!this.audio) this.close(); // after the utterance, an error ends the exchange
    }
  }
}
