// Push-to-talk over the WebSocket /v1/voice: the microphone as PCM16 mono 16 kHz frames,
// `audio.end` when the member lets go; the server answers with `transcript.final`, then
// `response.delta`s and `response.done` (or `error`). Asked to speak, it also sends the answer's
// audio: `response.audio.start` {sample_rate}, binary PCM16 frames, `response.audio.done`, all
// before `response.done`. One socket per utterance.
//
// The recorded frames wait for `session.ready`: a server without speech synthesis refuses
// `speak` (error tts_unavailable), and the session is started again without it.

import { token } from "./api.js";

const SAMPLE_RATE = 16000;

export function voiceSupport() {
  if (!window.isSecureContext) return "The microphone needs https or localhost";
  if (!navigator.mediaDevices || !window.AudioWorkletNode || !window.WebSocket) return "This browser cannot record";
  return null;
}

export class PushToTalk {
  // handlers: {transcript(text), delta(text), done(event), error(message), state(name),
  //            audioStart(sampleRate), audio(frame), audioDone(event), speechUnavailable()}
  constructor(handlers) {
    this.on = handlers;
    this.socket = null;
    this.audio = null;
    this.ready = false; // session.ready came: frames go straight out
    this.pending = []; // frames recorded before the session was ready
  }

  get recording() {
    return this.audio !== null;
  }

  // `speak`: ask the server to speak the answer too.
  async start(conversationId, { speak = false } = {}) {
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
    this.open(conversationId, speak);
    this.on.state("recording");
  }

  open(conversationId, speak) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/v1/voice`);
    socket.binaryType = "arraybuffer";
    this.ready = false;
    this.speak = speak;
    this.sessionStart = { type: "session.start", sample_rate: SAMPLE_RATE, conversation_id: conversationId };
    socket.onopen = () => this.startSession();
    socket.onmessage = (e) => {
      if (this.socket === socket) this.message(e.data);
    };
    socket.onerror = () => {
      if (!socket.superseded) this.on.error("The voice connection failed");
    };
    socket.onclose = (e) => {
      if (socket.superseded) return; // given up for a new utterance: its page state is gone already
      if (this.socket === socket) this.socket = null;
      if (e.code === 4401) this.on.error("Sign in again to talk");
      this.release();
      this.on.state("idle");
    };
    this.socket = socket;
  }

  startSession() {
    const start = { ...this.sessionStart, speak: this.speak };
    if (token.get()) start.token = token.get();
    this.socket.send(JSON.stringify(start));
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
    if (this.socket.readyState === WebSocket.OPEN && this.ready) this.socket.send(item);
    else if (this.socket.readyState <= WebSocket.OPEN) this.pending.push(item);
  }

  // The member let go: flush the last samples, then `audio.end`; the answer follows.
  stop() {
    if (!this.audio) return;
    this.audio.media.getTracks().forEach((t) => t.stop());
    this.audio.node.port.postMessage("flush");
    this.on.state("thinking");
  }

  // Stop the answer in progress (the server aborts its sequence and its synthesis).
  cancel() {
    this.send(JSON.stringify({ type: "response.cancel" }));
    this.close();
  }

  // Give up this exchange without a word to the page (it has moved on to a new utterance).
  abandon() {
    if (this.socket) this.socket.superseded = true;
    this.cancel();
  }

  close() {
    if (this.socket) this.socket.close();
    this.socket = null;
    this.ready = false;
    this.pending = [];
    this.release();
  }

  release() {
    if (!this.audio) return;
    this.audio.media.getTracks().forEach((t) => t.stop());
    this.audio.context.close().catch(() => {});
    this.audio = null;
  }

  message(data) {
    if (data instanceof ArrayBuffer) {
      this.on.audio(data);
      return;
    }
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    if (event.type === "session.ready") this.sessionReady();
    else if (event.type === "transcript.final") this.on.transcript(event.text || "");
    else if (event.type === "response.delta") this.on.delta(event.text || "");
    else if (event.type === "response.audio.start") this.on.audioStart(event.sample_rate);
    else if (event.type === "response.audio.done") this.on.audioDone(event);
    else if (event.type === "response.done") {
      this.on.done(event);
      this.close();
    } else if (event.type === "error") this.failed(event);
  }

  sessionReady() {
    this.ready = true;
    const pending = this.pending;
    this.pending = [];
    for (const item of pending) this.socket.send(item);
  }

  failed(event) {
    if (!this.ready && event.code === "tts_unavailable" && this.speak) {
      this.speak = false; // answer in words only, as before
      this.on.speechUnavailable();
      this.startSession();
      return;
    }
    this.on.error(event.message || event.code || "Voice error");
    // A session refused, or an error after the utterance, ends the exchange.
    if (!this.ready || !this.audio) this.close();
  }
}
