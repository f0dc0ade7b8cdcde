// Audio sources that deliver 16 kHz mono PCM16 chunks to one callback: the microphone (through the
// capture worklet) and a decoded file paced at real time. Both feed the same sending path.

import { floatToPcm16 } from "./pcm16.js";

export { floatToPcm16 };

export const RATE = 16000;
const FILE_CHUNK = 320; // samples per append in file mode: 20 ms, like the worklet's batches
const FLUSH_TIMEOUT_MS = 1000;

// Decodes any file the browser can read to 16 kHz mono (the browser resamples; channels averaged).
export async function decodeTo16k(arrayBuffer) {
  const ctx = new OfflineAudioContext(1, 1, RATE);
  const buffer = await ctx.decodeAudioData(arrayBuffer);
  const mono = new Float32Array(buffer.length);
  for (let c = 0; c < buffer.numberOfChannels; c++) {
    const data = buffer.getChannelData(c);
    for (let i = 0; i < data.length; i++) mono[i] += data[i] / buffer.numberOfChannels;
  }
  return mono;
}

export class MicSource {
  /** @param {AudioContext} ctx created inside the click handler (autoplay policy) */
  constructor(ctx, onPcm) {
    this.ctx = ctx;
    this.onPcm = onPcm;
    this.stream = null;
    this.node = null;
    this.source = null;
    this.flushed = null;
  }

  // Asks for the microphone and loads the worklet; no audio flows until start().
  async open() {
    this.stream = await navigator.mediaDevices.getUserMedia({
      // Raw audio: echo cancellation, noise suppression and gain control distort what the model hears.
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    await this.ctx.audioWorklet.addModule(new URL("capture-worklet.js", import.meta.url));
    this.node = new AudioWorkletNode(this.ctx, "pcm16-capture", { numberOfInputs: 1, numberOfOutputs: 0 });
    this.flushed = new Promise((resolve) => {
      this.node.port.onmessage = (event) => {
        if (event.data.type === "pcm") this.onPcm(event.data.pcm);
        else if (event.data.type === "flushed") resolve();
      };
    });
    this.source = this.ctx.createMediaStreamSource(this.stream);
  }

  get inputRate() {
    return this.ctx.sampleRate;
  }

  get deviceLabel() {
    return this.stream?.getAudioTracks()[0]?.label ?? "";
  }

  async start() {
    await this.ctx.resume();
    this.source.connect(this.node);
  }

  // Stops capture and waits until the worklet has handed over its last samples.
  async stop() {
    if (!this.node) return;
    this.source.disconnect();
    this.stream.getTracks().forEach((t) => t.stop());
    this.node.port.postMessage("flush");
    await Promise.race([this.flushed, new Promise((r) => setTimeout(r, FLUSH_TIMEOUT_MS))]);
    this.node = null;
    await this.ctx.close();
  }
}

export class FileSource {
  /**
   * @param {Int16Array} pcm 16 kHz mono samples
   * @param {(pcm: Int16Array) => void} onPcm
   * @param {() => void} onEnd called once every sample has been delivered
   * @param {AudioContext | null} playCtx plays the file aloud in step with the stream when given
   */
  constructor(pcm, onPcm, onEnd, playCtx = null) {
    this.pcm = pcm;
    this.onPcm = onPcm;
    this.onEnd = onEnd;
    this.playCtx = playCtx;
    this.sent = 0;
    this.timer = null;
    this.player = null;
  }

  get duration() {
    return this.pcm.length / RATE;
  }

  start() {
    if (this.playCtx) this.startPlayback();
    const t0 = performance.now();
    // Deliver by wall clock, not by timer count: late timers catch up instead of drifting.
    const tick = () => {
      const due = Math.min(this.pcm.length, Math.floor(((performance.now() - t0) / 1000) * RATE));
      while (this.sent + FILE_CHUNK <= due || (due === this.pcm.length && this.sent < due)) {
        const end = Math.min(this.sent + FILE_CHUNK, due);
        this.onPcm(this.pcm.slice(this.sent, end));
        this.sent = end;
      }
      if (this.sent >= this.pcm.length) {
        this.stop();
        this.onEnd();
      }
    };
    this.timer = setInterval(tick, 10);
  }

  startPlayback() {
    try {
      const buffer = this.playCtx.createBuffer(1, this.pcm.length, RATE);
      const data = buffer.getChannelData(0);
      for (let i = 0; i < this.pcm.length; i++) data[i] = this.pcm[i] / 32768;
      this.player = this.playCtx.createBufferSource();
      this.player.buffer = buffer;
      this.player.connect(this.playCtx.destination);
      this.playCtx.resume();
      this.player.start();
    } catch (err) {
      console.warn("cannot play the file aloud", err); // playback is a nicety; streaming goes on
    }
  }

  stop() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    if (this.player) {
      try {
        this.player.stop();
      } catch {
        /* already ended */
      }
      this.player = null;
    }
    if (this.playCtx) {
      const ctx = this.playCtx;
      this.playCtx = null;
      setTimeout(() => ctx.close().catch(() => {}), 500); // let the output buffer drain
    }
  }
}
