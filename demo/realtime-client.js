// vLLM-dialect realtime client: one utterance per connection.
//
//   session.created  <-  (server, on accept)
//   session.update {model, transcription_delay_ms}  ->
//   input_audio_buffer.commit            ->   start the utterance
//   input_audio_buffer.append {audio}    ->   base64 PCM16 LE mono 16 kHz, any number
//   input_audio_buffer.commit {final}    ->   end of audio
//   transcription.delta / transcription.done / error  <-
//
// Nothing here stalls silently: a missing handshake, a silent server and an unexpected close all
// become errors reported through `onError`.

const HANDSHAKE_TIMEOUT_MS = 10000;
const FATAL_CODES = new Set([
  "model_not_found", "model_not_validated", "processing_error", "server_busy", "server_full",
  "engine_stalled", "idle_timeout", "server_shutting_down", "too_many_sessions",
]);

export class RealtimeError extends Error {
  constructor(message, code = null) {
    super(message);
    this.code = code;
  }
}

// Browsers cannot set headers on a websocket. The key travels as a subprotocol entry (as OpenAI's
// browser clients send it: kept out of URLs and access logs) when it is a valid token, else as
// ?api_key=. The server accepts both.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

export function realtimeEndpoint(apiKey) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = new URL(`${scheme}//${location.host}/v1/realtime`);
  if (!apiKey) return { url: url.toString(), protocols: [] };
  if (TOKEN.test(apiKey)) return { url: url.toString(), protocols: ["realtime", `openai-insecure-api-key.${apiKey}`] };
  url.searchParams.set("api_key", apiKey);
  return { url: url.toString(), protocols: [] };
}

function pcmToBase64(pcm) {
  let bytes = new Uint8Array(pcm.buffer, pcm.byteOffset, pcm.byteLength);
  if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
    // big-endian host: the protocol wants little-endian samples
    const swapped = new Uint8Array(bytes.length);
    for (let i = 0; i < bytes.length; i += 2) [swapped[i], swapped[i + 1]] = [bytes[i + 1], bytes[i]];
    bytes = swapped;
  }
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

export class RealtimeClient {
  /**
   * @param {{endpoint: {url: string, protocols: string[]}, model: string, delayMs: number,
   *          onDelta: (msg: object) => void, onDone: (msg: object) => void,
   *          onError: (err: RealtimeError, fatal: boolean) => void, onClose: () => void}} opts
   */
  constructor(opts) {
    this.opts = opts;
    this.ws = null;
    this.finished = false; // final commit sent
    this.done = false; // transcription.done received
    this.closedByUs = false;
  }

  // Opens the socket, does the handshake and starts the utterance; resolves when audio may flow.
  connect() {
    return new Promise((resolve, reject) => {
      const { url, protocols } = this.opts.endpoint;
      const ws = new WebSocket(url, protocols);
      this.ws = ws;
      let ready = false;
      const timer = setTimeout(() => {
        if (!ready) {
          reject(new RealtimeError("The server did not start a session (no session.created within 10 s)."));
          this.close();
        }
      }, HANDSHAKE_TIMEOUT_MS);
      ws.onmessage = (event) => {
        let msg;
        try {
          msg = JSON.parse(event.data);
        } catch {
          this.opts.onError(new RealtimeError("The server sent a message that is not JSON."), false);
          return;
        }
        if (!ready && msg.type === "session.created") {
          ready = true;
          clearTimeout(timer);
          this.send({ type: "session.update", model: this.opts.model, transcription_delay_ms: this.opts.delayMs });
          this.send({ type: "input_audio_buffer.commit" });
          resolve();
          return;
        }
        if (!ready && msg.type === "error") {
          clearTimeout(timer);
          ready = true;
          reject(errorFromEvent(msg));
          this.close();
          return;
        }
        this.dispatch(msg);
      };
      ws.onerror = () => {
        // The browser hides the reason; onclose follows with the code.
      };
      ws.onclose = (event) => {
        clearTimeout(timer);
        if (!ready) {
          ready = true;
          const why = event.code === 1006
            ? "The server refused the connection (wrong or missing API key, origin not allowed) or is down."
            : closeMessage(event, "before the session started");
          reject(new RealtimeError(why));
        } else if (!this.done && !this.closedByUs) {
          this.opts.onError(new RealtimeError(closeMessage(event, "before the transcript was complete")), true);
        }
        this.opts.onClose();
      };
    });
  }

  dispatch(msg) {
    switch (msg.type) {
      case "transcription.delta":
        this.opts.onDelta(msg);
        break;
      case "transcription.done":
        this.done = true;
        this.opts.onDone(msg);
        break;
      case "error": {
        const err = errorFromEvent(msg);
        // The socket stays open after an error, but these leave the utterance dead.
        const fatal = FATAL_CODES.has(err.code);
        this.opts.onError(err, fatal);
        break;
      }
      default:
        break; // session.updated and other extras are harmless
    }
  }

  send(obj) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(obj));
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  appendPcm(pcm) {
    if (this.finished || pcm.length === 0) return false;
    if (!this.isOpen) return false;
    this.ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: pcmToBase64(pcm) }));
    return true;
  }

  finish() {
    if (this.finished) return;
    this.finished = true;
    this.send({ type: "input_audio_buffer.commit", final: true });
  }

  close() {
    this.closedByUs = true;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, "client done");
  }
}

function errorFromEvent(msg) {
  // vLLM: {"error": "text", "code": "..."}; OpenAI-style nests {"error": {message, code}}.
  const e = msg.error;
  if (e && typeof e === "object") return new RealtimeError(e.message || JSON.stringify(e), e.code || null);
  return new RealtimeError(String(e ?? "unknown error"), msg.code ?? null);
}

function closeMessage(event, when) {
  const reason = event.reason ? `: ${event.reason}` : "";
  return `Connection closed ${when} (code ${event.code}${reason}).`;
}

export { pcmToBase64 };
