// Float samples -> PCM16, shared by the page (file mode) and the capture AudioWorklet (which loads
// this as an ES module import), so both paths send exactly the same bytes.

export function floatToPcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    // Asymmetric scale, as Chromium decodes PCM16 (k / 32767 above zero, k / 32768 below): a
    // 16-bit file round-trips exactly. Clamp what a float source might overshoot.
    const x = samples[i];
    const v = Math.round(x < 0 ? x * 32768 : x * 32767);
    out[i] = v > 32767 ? 32767 : v < -32768 ? -32768 : v;
  }
  return out;
}
