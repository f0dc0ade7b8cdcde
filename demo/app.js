// streamscribe demo page: microphone or WAV file -> 16 kHz PCM16 -> /v1/realtime -> live transcript;
// or a file uploaded to /v1/audio/transcriptions (stream=true), its text read from server-sent events.
//
// Test hooks: #transcript holds exactly the concatenated delta text; window.streamscribe exposes
// the run state; with ?debug=pcm in the URL (or streamscribe.debug.keepPcm = true) the page keeps
// a copy of every PCM16 byte it sent, readable with streamscribe.sentPcmBase64().

import { FileSource, MicSource, RATE, decodeTo16k, floatToPcm16 } from "./audio-sources.js";
import { RealtimeClient, pcmToBase64, realtimeEndpoint } from "./realtime-client.js";

const DELAYS_MS = [...Array.from({ length: 15 }, (_, i) => 80 * (i + 1)), 2400];
const DEFAULT_DELAY_MS = 480;
const SAMPLE_URL = new URL("samples/sample_en.wav", import.meta.url);
const STALL_WARN_MS = 5000; // no server message for this long while streaming: tell the user
const STALL_FAIL_MS = 20000; // ... after the end of audio: give up and say so
const LATENCY_WINDOW = 4000; // tokens (about 5 minutes) behind the live p50/p95

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"),
  delay: $("delay"),
  apiKey: $("api-key"),
  mic: $("mic-btn"),
  sample: $("sample-btn"),
  file: $("file-input"),
  upload: $("upload-input"),
  stop: $("stop-btn"),
  playAloud: $("play-aloud"),
  status: $("status"),
  error: $("error"),
  sent: $("sent-seconds"),
  transcript: $("transcript"),
  announcer: $("announcer"),
  words: $("words"),
  latLast: $("lat-last"),
  latP50: $("lat-p50"),
  latP95: $("lat-p95"),
  latCount: $("lat-count"),
  firstText: $("first-text"),
};

const keptPcm = [];
const state = {
  state: "idle", // idle | connecting | streaming | finishing | done | error
  mode: null, // "mic" | "file" | "upload"
  model: "",
  delayMs: DEFAULT_DELAY_MS,
  inputRate: null, // audio context rate the worklet resampled from (mic mode)
  text: "", // concatenation of every delta
  finalText: null, // transcription.done text
  done: false,
  deltas: 0,
  sentPcm: 0, // bytes of PCM16 sent
  sentChunks: 0,
  streamStart: null, // performance.now() of the first sample of the stream
  latency: { last: null, p50: null, p95: null, count: 0, values: [] },
  firstTextMs: null,
  usage: null,
  audioSeconds: null, // upload: the file's duration, from the server
  words: [],
  errors: [],
  debug: { keepPcm: new URLSearchParams(location.search).get("debug") === "pcm" },
  sentPcmBase64() {
    let n = 0;
    for (const c of keptPcm) n += c.length;
    const all = new Int16Array(n);
    let at = 0;
    for (const c of keptPcm) {
      all.set(c, at);
      at += c.length;
    }
    return pcmToBase64(all);
  },
};
window.streamscribe = state;

let client = null;
let source = null;
let upload = null; // AbortController of the upload in progress
let runId = 0;
let lastServerMessage = 0;
let watchdog = null;
let renderQueued = false;

// ---------------------------------------------------------------------------------------------
// Status and errors

const STATUS_TEXT = {
  idle: "Idle.",
  connecting: "Connecting…",
  streaming: "Streaming audio: transcribing live.",
  finishing: "Audio ended: waiting for the final transcript…",
  done: "Done: transcript complete.",
  error: "Stopped because of an error.",
};

function setState(next, detail = "") {
  state.state = next;
  ui.status.dataset.state = next;
  ui.status.textContent = detail || STATUS_TEXT[next];
  const busy = next === "connecting" || next === "streaming" || next === "finishing";
  ui.mic.disabled = busy;
  ui.sample.disabled = busy;
  ui.file.disabled = busy;
  ui.upload.disabled = busy;
  ui.model.disabled = busy;
  ui.delay.disabled = busy;
  ui.apiKey.disabled = busy;
  ui.stop.disabled = !(next === "streaming" || next === "connecting");
  document.body.classList.toggle("busy", busy);
}

function showError(message, code = null) {
  const text = code ? `${message} (${code})` : message;
  state.errors.push({ message, code });
  ui.error.hidden = false;
  const line = document.createElement("p");
  line.textContent = text;
  ui.error.append(line);
}

function clearErrors() {
  ui.error.hidden = true;
  ui.error.replaceChildren();
}

// ---------------------------------------------------------------------------------------------
// Models and settings

function fillDelays() {
  for (const ms of DELAYS_MS) {
    const opt = new Option(`${ms} ms`, String(ms), ms === DEFAULT_DELAY_MS, ms === DEFAULT_DELAY_MS);
    ui.delay.add(opt);
  }
}

let modelsRequest = 0; // only the latest request may fill the list (the key can change meanwhile)

async function loadModels() {
  const mine = ++modelsRequest;
  const headers = ui.apiKey.value ? { Authorization: `Bearer ${ui.apiKey.value}` } : {};
  let ids;
  try {
    const resp = await fetch("/v1/models", { headers });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}${resp.status === 401 ? ": enter a valid API key" : ""}`);
    const body = await resp.json();
    ids = (body.data || []).map((m) => m.id);
    if (ids.length === 0) throw new Error("the server lists no models");
  } catch (err) {
    if (mine !== modelsRequest) return;
    ui.model.replaceChildren(new Option("(unavailable)", ""));
    showError(`Could not list models: ${err.message}.`);
    return;
  }
  if (mine !== modelsRequest) return;
  ui.model.replaceChildren(...ids.map((id, i) => new Option(id, id, i === 0, i === 0)));
}

// ---------------------------------------------------------------------------------------------
// A run: one source, one connection, one utterance

function resetRun(mode) {
  clearErrors();
  clearInterval(watchdog);
  keptPcm.length = 0;
  Object.assign(state, {
    mode,
    model: ui.model.value,
    delayMs: Number(ui.delay.value),
    inputRate: null,
    text: "",
    finalText: null,
    done: false,
    deltas: 0,
    sentPcm: 0,
    sentChunks: 0,
    streamStart: null,
    latency: { last: null, p50: null, p95: null, count: 0, values: [] },
    firstTextMs: null,
    usage: null,
    audioSeconds: null,
    words: [],
    errors: [],
  });
  resetTranscript();
  ui.words.replaceChildren();
  ui.announcer.replaceChildren();
  ui.sent.value = "0.0";
  queueRender();
}

// `prepare(ctx)` returns an opened source (microphone permission granted / file decoded).
async function startRun(mode, prepare) {
  const run = ++runId;
  const current = () => run === runId && state.state === "connecting"; // not cancelled or failed meanwhile
  resetRun(mode);
  setState("connecting", mode === "mic" ? "Asking for the microphone…" : "Loading the file…");
  // Created inside the click so the browser lets it run (autoplay policy).
  const ctx = new AudioContext();
  try {
    const opened = await prepare(ctx);
    if (!current()) {
      opened.stop().catch(() => {});
      return;
    }
    source = opened;
    if (mode === "mic") state.inputRate = source.inputRate;
    setState("connecting");
    client = new RealtimeClient({
      endpoint: realtimeEndpoint(ui.apiKey.value),
      model: state.model,
      delayMs: state.delayMs,
      onDelta,
      onDone,
      onError: (err, fatal) => (fatal ? fail(err.message, err.code) : showError(err.message, err.code)),
      onClose: () => {},
    });
    await client.connect();
    if (!current()) return;
    lastServerMessage = performance.now();
    watchdog = setInterval(checkStall, 1000);
    setState("streaming", mode === "mic" ? "Listening: speak now." : "Streaming the file at real time…");
    await source.start();
  } catch (err) {
    if (run === runId) fail(err.message || String(err), err.code ?? null);
  }
}

function onPcm(pcm) {
  if (!client || client.finished) return;
  if (state.streamStart === null) {
    // The first chunk's first sample was captured one chunk-duration ago.
    state.streamStart = performance.now() - (pcm.length / RATE) * 1000;
  }
  if (!client.appendPcm(pcm)) return;
  if (state.debug.keepPcm) keptPcm.push(pcm.slice());
  state.sentPcm += pcm.byteLength;
  state.sentChunks += 1;
  queueRender();
}

async function stopAudio() {
  if (state.mode === "upload" && upload) {
    runId++;
    upload.abort(); // the server sees the client leave and stops the file's transcription
    upload = null;
    setState("idle", "Cancelled.");
    return;
  }
  if (state.state === "connecting") {
    runId++; // the run in progress sees it was cancelled
    teardown();
    setState("idle", "Cancelled.");
    return;
  }
  if (state.state !== "streaming") return;
  setState("finishing");
  try {
    await source.stop(); // hands over the last samples first
  } catch (err) {
    console.warn("stopping the source", err);
  }
  client.finish();
}

function fail(message, code = null) {
  if (state.state === "error" || state.state === "done") {
    showError(message, code);
    return;
  }
  showError(message, code);
  setState("error");
  teardown();
}

function teardown() {
  if (upload) upload.abort();
  upload = null;
  clearInterval(watchdog);
  watchdog = null;
  if (source) source.stop().catch(() => {});
  source = null;
  if (client) client.close();
}

function checkStall() {
  const quiet = performance.now() - lastServerMessage;
  if (state.state === "finishing" && quiet > STALL_FAIL_MS) {
    fail(`No final transcript: the server sent nothing for ${Math.round(quiet / 1000)} s after the audio ended.`);
  } else if (state.state === "streaming" && quiet > STALL_WARN_MS && state.sentPcm > 0) {
    ui.status.textContent = `Streaming, but the server has sent nothing for ${Math.round(quiet / 1000)} s…`;
  } else if (state.state === "streaming") {
    ui.status.textContent = state.mode === "mic" ? "Listening: speak now." : "Streaming the file at real time…";
  }
}

// ---------------------------------------------------------------------------------------------
// Server events

function sentMs() {
  return (state.sentPcm / 2 / RATE) * 1000;
}

function onDelta(msg) {
  lastServerMessage = performance.now();
  state.deltas += 1;
  const delta = typeof msg.delta === "string" ? msg.delta : "";
  if (delta) {
    state.text += delta;
    appendTranscript(delta);
    if (state.firstTextMs === null && delta.trim() && state.streamStart !== null) {
      state.firstTextMs = performance.now() - state.streamStart;
    }
  }
  // Tokens of the end-of-stream flush are decided on the server's own padding: their audio_end_ms
  // is the end of the audio (clamped) and their wait is the flush, not streaming latency.
  const audioEnd = msg.audio_end_ms;
  const flushToken = client?.finished && audioEnd >= sentMs();
  if (typeof audioEnd === "number" && state.streamStart !== null && !flushToken) {
    const d = performance.now() - (state.streamStart + audioEnd);
    state.latency.values.push(d);
    state.latency.count += 1;
    // p50/p95 over the recent tokens: an hour-long session must not sort 45 000 numbers a frame
    if (state.latency.values.length > LATENCY_WINDOW) state.latency.values.splice(0, LATENCY_WINDOW / 2);
    state.latency.last = d;
  }
  for (const w of wordsOf(msg)) addWord(w);
  queueRender();
}

function onDone(msg) {
  lastServerMessage = performance.now();
  state.finalText = typeof msg.text === "string" ? msg.text : state.text;
  state.usage = msg.usage ?? null;
  state.done = true;
  endSegment();
  if (Array.isArray(msg.words)) {
    // The final event lists every word, the last one included (it ends only with the stream).
    state.words = [];
    ui.words.replaceChildren();
    for (const w of wordsOf(msg)) addWord(w);
  }
  if (state.finalText !== state.text) {
    showError("The final transcript differs from the streamed text; showing the streamed text.");
  }
  const seconds = state.mode === "upload" ? state.audioSeconds ?? 0 : state.sentPcm / 2 / RATE;
  setState("done", `Done: ${state.deltas} updates, ${seconds.toFixed(1)} s of audio.`);
  teardown();
  queueRender();
}

// ---------------------------------------------------------------------------------------------
// Transcript rendering: words already ended (a space followed them) are final; the word being
// spoken is partial. The two text nodes together are exactly the delta text.

const finalNode = document.createTextNode("");
const partialNode = document.createTextNode("");
let announced = 0; // characters of final text already handed to screen readers

function resetTranscript() {
  finalNode.data = "";
  partialNode.data = "";
  announced = 0;
  const fin = document.createElement("span");
  fin.className = "final";
  fin.append(finalNode);
  const part = document.createElement("span");
  part.className = "partial";
  part.append(partialNode);
  ui.transcript.replaceChildren(fin, part);
}

function appendTranscript(delta) {
  const tail = partialNode.data + delta;
  const cut = Math.max(tail.lastIndexOf(" "), tail.lastIndexOf("\n"), tail.lastIndexOf("\t"));
  if (cut >= 0) {
    finalNode.appendData(tail.slice(0, cut + 1));
    partialNode.data = tail.slice(cut + 1);
    announceSentences(false);
  } else {
    partialNode.data = tail;
  }
}

function endSegment() {
  finalNode.appendData(partialNode.data);
  partialNode.data = "";
  announceSentences(true);
}

// Screen readers hear whole sentences (and the rest at the end), not every 80 ms update.
function announceSentences(all) {
  const text = finalNode.data;
  let end = text.length;
  if (!all) {
    const m = text.slice(announced).match(/^[\s\S]*[.!?。]\s/);
    if (!m) return;
    end = announced + m[0].length;
  }
  const sentence = text.slice(announced, end).trim();
  announced = end;
  if (sentence) {
    const line = document.createElement("p");
    line.textContent = sentence;
    ui.announcer.append(line);
  }
}

// Word timestamps, if the server sends them: [{word|text, start_ms, end_ms}] on a delta.
function wordsOf(msg) {
  const list = Array.isArray(msg.words) ? msg.words : [];
  return list
    .map((w) => ({
      text: String(w.word ?? w.text ?? ""),
      start: Number(w.start_ms ?? (w.start ?? NaN) * 1000),
      end: Number(w.end_ms ?? (w.end ?? NaN) * 1000),
    }))
    .filter((w) => w.text.trim());
}

function addWord(w) {
  state.words.push(w);
  const li = document.createElement("li");
  const word = document.createElement("span");
  word.className = "word";
  word.textContent = w.text.trim();
  const time = document.createElement("small");
  const ok = Number.isFinite(w.start);
  time.textContent = ok ? (w.start / 1000).toFixed(2) : "?";
  if (ok && Number.isFinite(w.end)) {
    li.title = `${(w.start / 1000).toFixed(2)}–${(w.end / 1000).toFixed(2)} s`;
  }
  li.append(word, time);
  ui.words.append(li);
}

// ---------------------------------------------------------------------------------------------
// Live numbers, at most once per frame

function percentile(sorted, q) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}

const fmtMs = (v) => (v === null ? "–" : `${Math.round(v)} ms`);

function queueRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(render);
}

function render() {
  renderQueued = false;
  const sorted = [...state.latency.values].sort((a, b) => a - b);
  state.latency.p50 = percentile(sorted, 0.5);
  state.latency.p95 = percentile(sorted, 0.95);
  ui.latLast.value = fmtMs(state.latency.last);
  ui.latP50.value = fmtMs(state.latency.p50);
  ui.latP95.value = fmtMs(state.latency.p95);
  ui.latCount.value = String(state.latency.count);
  ui.firstText.value = fmtMs(state.firstTextMs);
  ui.sent.value = (state.sentPcm / 2 / RATE).toFixed(1);
}

// ---------------------------------------------------------------------------------------------
// Upload: POST /v1/audio/transcriptions with stream=true; the body is server-sent events

async function startUpload(file) {
  const run = ++runId;
  resetRun("upload");
  setState("connecting", `Uploading ${file.name}…`);
  const form = new FormData();
  form.append("file", file, file.name);
  form.append("model", state.model);
  form.append("stream", "true");
  form.append("transcription_delay_ms", String(state.delayMs));
  const headers = ui.apiKey.value ? { Authorization: `Bearer ${ui.apiKey.value}` } : {};
  upload = new AbortController();
  const started = performance.now();
  try {
    const resp = await fetch("/v1/audio/transcriptions", { method: "POST", body: form, headers, signal: upload.signal });
    if (!resp.ok) {
      const body = await resp.json().catch(() => null);
      const err = body?.error ?? {};
      const hint = resp.status === 401 ? ": enter a valid API key" : "";
      throw Object.assign(new Error(`${err.message ?? `HTTP ${resp.status}`}${hint}`), { code: err.code ?? null });
    }
    if (run !== runId) return;
    setState("streaming", "Transcribing the file as fast as the server can…");
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += value;
      let cut;
      while ((cut = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, cut);
        buffered = buffered.slice(cut + 2);
        if (run !== runId) return;
        onUploadEvent(event, started);
      }
    }
    if (run === runId && !state.done && state.state !== "error") {
      fail("The server closed the upload's stream before the final transcript.");
    }
  } catch (err) {
    if (run === runId && err.name !== "AbortError") fail(err.message || String(err), err.code ?? null);
  } finally {
    if (run === runId) upload = null;
  }
}

function onUploadEvent(block, started) {
  const data = block
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).trimStart())
    .join("\n");
  if (!data || data === "[DONE]") return;
  const msg = JSON.parse(data);
  lastServerMessage = performance.now();
  if (msg.error) {
    fail(msg.error.message ?? "The server failed the transcription.", msg.error.code ?? null);
  } else if (msg.type === "transcript.text.delta") {
    state.deltas += 1;
    state.text += msg.delta;
    appendTranscript(msg.delta);
    if (state.firstTextMs === null && msg.delta.trim()) state.firstTextMs = performance.now() - started;
    queueRender();
  } else if (msg.type === "transcript.text.done") {
    state.audioSeconds = typeof msg.duration === "number" ? msg.duration : null;
    onDone(msg);
  }
}

// ---------------------------------------------------------------------------------------------
// Controls

async function readFileSource(ctx, bytesPromise) {
  const samples = await decodeTo16k(await bytesPromise);
  if (samples.length === 0) throw new Error("The file holds no audio.");
  const playCtx = ui.playAloud.checked ? ctx : null;
  if (!playCtx) ctx.close();
  return new FileSource(floatToPcm16(samples), onPcm, () => stopAudio(), playCtx);
}

async function fetchBytes(url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`Could not fetch ${url.pathname ?? url}: HTTP ${resp.status}`);
  return resp.arrayBuffer();
}

function init() {
  fillDelays();
  loadModels();
  ui.apiKey.addEventListener("change", () => {
    clearErrors();
    loadModels();
  });
  ui.mic.addEventListener("click", () =>
    startRun("mic", async (ctx) => {
      if (!navigator.mediaDevices?.getUserMedia) throw new Error("This browser cannot record audio here (needs https or localhost).");
      const mic = new MicSource(ctx, onPcm);
      try {
        await mic.open();
      } catch (err) {
        ctx.close();
        throw new Error(`Microphone unavailable: ${err.message}`);
      }
      return mic;
    }),
  );
  ui.sample.addEventListener("click", () => startRun("file", (ctx) => readFileSource(ctx, fetchBytes(SAMPLE_URL))));
  ui.file.addEventListener("change", () => {
    const file = ui.file.files[0];
    if (!file) return;
    startRun("file", (ctx) => readFileSource(ctx, file.arrayBuffer()));
    ui.file.value = ""; // choosing the same file again starts another run
  });
  ui.upload.addEventListener("change", () => {
    const file = ui.upload.files[0];
    if (!file) return;
    startUpload(file);
    ui.upload.value = "";
  });
  ui.stop.addEventListener("click", () => stopAudio());
  setState("idle");
}

init();
