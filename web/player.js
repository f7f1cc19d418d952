// Playing speech as it arrives: PCM16 mono frames (from /v1/voice or /v1/audio/speech) become
// AudioBuffers at the server's sample rate, each scheduled right after the one before, so an
// answer plays while the server is still synthesising it. One player for the page: a new
// answer, speaking again, or muting (chat.js) stops what is playing at once.
//
// `stats` is what a test (or a curious member) can watch: frames received and scheduled, buffers
// that finished playing, seconds scheduled, and whether anything is playing now.

const LEAD_S = 0.05; // the first buffer starts this far ahead: room to schedule the next
const PLAYING_CLASS = "speaking";

export class PcmPlayer {
  constructor() {
    this.context = null;
    this.sources = new Set();
    this.next = 0; // the context time the next buffer starts at
    this.rate = 0;
    this.carry = null; // an odd byte left over from a chunk of a byte stream
    this.stats = { received: 0, scheduled: 0, played: 0, seconds: 0, playing: false, sampleRate: 0 };
    this.onchange = () => {};
  }

  // Browsers start audio only after a gesture: call this from a click or press.
  unlock() {
    if (!this.context) this.context = new AudioContext();
    if (this.context.state === "suspended") this.context.resume().catch(() => {});
  }

  // A new stream of audio at `sampleRate` Hz: whatever was playing stops.
  begin(sampleRate) {
    this.stop();
    this.rate = sampleRate;
    this.stats.sampleRate = sampleRate;
  }

  // A piece of the stream (an ArrayBuffer or a Uint8Array of PCM16 little-endian bytes).
  push(data) {
    let bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
    this.stats.received += 1;
    if (this.carry !== null) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.carry;
      joined.set(bytes, 1);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2) {
      this.carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    if (!bytes.length || !this.rate) return;
    this.unlock();
    this.schedule(toFloat(bytes));
  }

  schedule(samples) {
    const context = this.context;
    const buffer = context.createBuffer(1, samples.length, this.rate);
    buffer.copyToChannel(samples, 0);
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(context.destination);
    const at = Math.max(this.next, context.currentTime + LEAD_S);
    source.onended = () => {
      if (!this.sources.delete(source)) return; // stopped, not played out
      this.stats.played += 1;
      this.changed();
    };
    source.start(at);
    this.next = at + buffer.duration;
    this.sources.add(source);
    this.stats.scheduled += 1;
    this.stats.seconds += buffer.duration;
    this.changed();
  }

  // Stop at once: scheduled buffers are dropped.
  stop() {
    const playing = [...this.sources];
    this.sources.clear();
    for (const source of playing) {
      try {
        source.stop();
      } catch {
        /* never started */
      }
    }
    this.next = 0;
    this.carry = null;
    this.changed();
  }

  get playing() {
    return this.sources.size > 0;
  }

  changed() {
    this.stats.playing = this.playing;
    document.body.classList.toggle(PLAYING_CLASS, this.playing);
    this.onchange();
  }
}

function toFloat(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
  const samples = new Float32Array(bytes.length / 2);
  for (let i = 0; i < samples.length; i += 1) samples[i] = view.getInt16(2 * i, true) / 0x8000;
  return samples;
}

export const player = new PcmPlayer();
window.homeaiPlayer = player; // for tests: `page.evaluate("homeaiPlayer.stats")`
