// Microphone samples (the audio context's rate, float32) to PCM16 mono at the target rate
// (16 kHz for /v1/voice), posted to the page in frames of about 40 ms. Each output sample
// is the mean of the input samples it covers: a box filter, enough against aliasing in speech.

class Pcm16Processor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const target = (options.processorOptions && options.processorOptions.targetRate) || 16000;
    this.step = sampleRate / target; // input samples per output sample
    this.frame = new Int16Array(Math.round(target * 0.04));
    this.filled = 0;
    this.sum = 0;
    this.count = 0;
    this.position = 0; // input samples consumed towards the next output sample
    this.port.onmessage = () => this.flush(); // the page asks at the end of an utterance
  }

  flush() {
    if (this.filled) this.port.postMessage(this.frame.slice(0, this.filled).buffer);
    this.filled = 0;
    this.port.postMessage("flushed");
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i += 1) {
      this.sum += channel[i];
      this.count += 1;
      this.position += 1;
      if (this.position >= this.step) {
        this.position -= this.step;
        this.emit(this.sum / this.count);
        this.sum = 0;
        this.count = 0;
      }
    }
    return true;
  }

  emit(sample) {
    const clipped = Math.max(-1, Math.min(1, sample));
    this.frame[this.filled] = clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff;
    this.filled += 1;
    if (this.filled === this.frame.length) {
      const full = this.frame;
      this.frame = new Int16Array(full.length); // before the transfer below empties `full`
      this.filled = 0;
      this.port.postMessage(full.buffer, [full.buffer]);
    }
  }
}

registerProcessor("pcm16", Pcm16Processor);
