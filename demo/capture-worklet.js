// AudioWorklet: microphone blocks (context rate, any channel count) -> 16 kHz mono PCM16 batches.
//
// The resampler is a windowed-sinc interpolator whose read position (a fractional input index) and
// input history are carried from one 128-frame block to the next, so the output is one continuous
// signal: no clicks or drift at block edges whatever the ratio (44.1 kHz -> 16 kHz is not integer).
// Its cutoff sits below the output Nyquist frequency so downsampling does not alias.

import { floatToPcm16 } from "./pcm16.js";

const OUT_RATE = 16000;
const BATCH = 320; // output samples per message: 20 ms, small enough to add little latency
const HALF_TAPS = 16; // kernel half-width in output samples
const TABLE_RES = 512; // kernel table entries per input sample

class SincResampler {
  constructor(inRate, outRate) {
    this.step = inRate / outRate; // input samples per output sample
    this.passthrough = inRate === outRate;
    // Cutoff as a fraction of the input Nyquist frequency: a little below the output Nyquist.
    this.cutoff = Math.min(1, outRate / inRate) * 0.9;
    this.halfWidth = Math.ceil(HALF_TAPS / this.cutoff); // in input samples
    const n = this.halfWidth * TABLE_RES + 1;
    this.table = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const x = i / TABLE_RES; // distance in input samples
      const a = Math.PI * this.cutoff * x;
      const sinc = x === 0 ? 1 : Math.sin(a) / a;
      const w = 0.42 + 0.5 * Math.cos((Math.PI * x) / this.halfWidth) + 0.08 * Math.cos((2 * Math.PI * x) / this.halfWidth);
      this.table[i] = this.cutoff * sinc * w; // Blackman window; cutoff scaling keeps unit DC gain
    }
    // Zeros before the first sample so the first outputs have a full (silent) history.
    this.buf = new Float32Array(this.halfWidth);
    this.pos = this.halfWidth; // fractional index into buf of the next output sample
  }

  // Resample one block; returns the output samples it completes (possibly none).
  push(input) {
    if (this.passthrough) return input.slice();
    const buf = new Float32Array(this.buf.length + input.length);
    buf.set(this.buf);
    buf.set(input, this.buf.length);
    const out = [];
    const hw = this.halfWidth;
    // An output sample needs hw input samples on each side of its position.
    while (this.pos + hw <= buf.length - 1) {
      const p = this.pos;
      const first = Math.ceil(p - hw);
      const last = Math.floor(p + hw);
      let acc = 0;
      for (let i = first; i <= last; i++) {
        const d = Math.abs(p - i);
        acc += buf[i] * this.table[Math.round(d * TABLE_RES)];
      }
      out.push(acc);
      this.pos += this.step;
    }
    // Keep only the history the next output still needs; carry the fractional position over.
    const keep = Math.max(0, Math.floor(this.pos - hw));
    this.buf = buf.slice(keep);
    this.pos -= keep;
    return Float32Array.from(out);
  }

  // End of input: zeros after the last sample release the outputs that were waiting on look-ahead.
  flush() {
    if (this.passthrough) return new Float32Array(0);
    // Outputs still owed: those whose position falls before the end of the real input.
    const remaining = this.buf.length - this.pos;
    const expected = remaining > 0 ? Math.ceil(remaining / this.step - 1e-9) : 0;
    return this.push(new Float32Array(this.halfWidth + 1)).subarray(0, expected);
  }
}


class Pcm16CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    // `sampleRate` is the AudioWorkletGlobalScope's context rate.
    this.resampler = new SincResampler(sampleRate, OUT_RATE);
    this.pending = new Float32Array(BATCH);
    this.filled = 0;
    this.stopped = false;
    this.port.onmessage = (event) => {
      if (event.data === "flush" && !this.stopped) {
        this.stopped = true;
        this.emit(this.resampler.flush());
        this.post(this.filled);
        this.port.postMessage({ type: "flushed" });
      }
    };
  }

  post(n) {
    if (n === 0) return;
    const pcm = floatToPcm16(this.pending.subarray(0, n));
    this.port.postMessage({ type: "pcm", pcm }, [pcm.buffer]);
    this.filled = 0;
  }

  emit(samples) {
    for (let i = 0; i < samples.length; i++) {
      this.pending[this.filled++] = samples[i];
      if (this.filled === BATCH) this.post(BATCH);
    }
  }

  process(inputs) {
    if (this.stopped) return false;
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true; // not connected yet
    const n = channels[0].length;
    let mono = channels[0];
    if (channels.length > 1) {
      mono = new Float32Array(n);
      for (const ch of channels) for (let i = 0; i < n; i++) mono[i] += ch[i] / channels.length;
    }
    this.emit(this.resampler.push(mono));
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16CaptureProcessor);
