"""The demo page in a real headless Chromium against the real server (default model, CPU).

Every way in must give exactly what a plain websocket client gets:
(a) fake microphone: Chromium plays a WAV as the microphone; the page resamples it in its
    AudioWorklet and streams it. The page keeps a copy of the PCM16 it sent (?debug=pcm); replaying
    those bytes with a websocket client must give the page's transcript, and the bytes must be the
    WAV (cross-correlation after alignment), so a broken resampler or dropped chunks fail.
(b) sample file: the page fetches the WAV, decodes it to 16 kHz and streams it at real time; its
    bytes must equal the WAV's samples and its transcript the websocket client's transcript.
(c) a user's 48 kHz stereo WAV through the file picker: decoded, mixed and resampled by the browser.
The server requires an API key, so the page's key handling is exercised on the way; without the
key the page must say so instead of stalling.

Chromium is driven over the DevTools protocol with `websockets` (no Playwright, no downloads).
Skipped when /usr/bin/chromium is missing, except in CI (CI=true), where .ci/run installs it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import soundfile as sf
import websockets

from conftest import synthetic_audio
from test_server_common import StalledEngine, wait_for
from realtime.audio import resample
from realtime.serving import TranscriptionEngine
from stream_server.background import ServerThread
from stream_server.engine_factory import build_engine
from stream_server.loadtest import ClientConfig, load_pcm16, transcribe_pcm
from stream_server.settings import ServerSettings

CHROMIUM = os.environ.get("STREAMSCRIBE_CHROMIUM", "/usr/bin/chromium")
SAMPLE = Path(__file__).resolve().parent.parent / "demo" / "samples" / "sample_en.wav"
# espeak-ng's formant voice en-us-nyc+f4: a held-out voice whose accent (en-us-nyc) and variant (f4) no
# training voice uses (realtime/train/voices.py), saying a sentence of the corpus's *test* split (never
# trained on); 16 kHz mono PCM16, 1.0 s silence + the sentence + 0.5 s silence. Made with
# `python benchmarks/make_speech_clips.py --sentence ... --voice espeak:en-us-nyc+f4`. It is the held-out
# voice the shipped model does best on (11% WER). Of 19 test sentences tried with it (ninth session), 11
# came out exactly; this is one of the 10 that also do so at every start offset tried (0-1260 samples in
# steps of 20), at gains 0.25-2, and after a 48 kHz round trip, as the browser's capture moves both
# (model card: Results). The eighth session's sentence ("she often has to work off the clock") reads
# "toework" at 2 of those 64 offsets with the current model.
HELDOUT = SAMPLE.parent / "heldout_nyc_f4.wav"
HELDOUT_TEXT = "my children finally got me to buy a computer"
RUN_TIMEOUT_S = 90.0

# Outside CI a missing browser skips; in CI (CI=true, where .ci/run installs it) it fails.
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                                reason=f"{CHROMIUM} is not installed (apt-get install chromium)")


# ---------------------------------------------------------------------------------------------
# A minimal DevTools-protocol driver
# ---------------------------------------------------------------------------------------------
class PageError(RuntimeError):
    pass


@dataclass
class Cdp:
    """The browser's DevTools websocket: commands by id, events to the page of their session."""

    ws: Any
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    pages: dict[str, "Page"] = field(default_factory=dict)
    next_id: int = 0
    reader: asyncio.Task | None = None

    def start(self) -> None:
        self.reader = asyncio.create_task(self._read())

    async def call(self, method: str, session_id: str | None = None, **params: Any) -> dict:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session_id is not None:
            msg["sessionId"] = session_id
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps(msg))
        reply = await asyncio.wait_for(fut, 30)
        if "error" in reply:
            raise PageError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def _read(self) -> None:
        async for raw in self.ws:
            msg = json.loads(raw)
            if "id" in msg:
                fut = self.pending.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif msg.get("sessionId") in self.pages:
                self.pages[msg["sessionId"]].on_event(msg)


@dataclass
class Page:
    """One tab; keeps the page's console output and exceptions for failure messages."""

    cdp: Cdp
    session_id: str
    console: list[str] = field(default_factory=list)

    async def call(self, method: str, **params: Any) -> dict:
        return await self.cdp.call(method, self.session_id, **params)

    def on_event(self, msg: dict) -> None:
        if msg.get("method") == "Runtime.consoleAPICalled":
            args = msg["params"].get("args", [])
            self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
        elif msg.get("method") == "Runtime.exceptionThrown":
            self.console.append("exception: " + json.dumps(msg["params"]["exceptionDetails"])[:500])

    async def eval(self, expression: str, *, gesture: bool = False) -> Any:
        res = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True,
                              userGesture=gesture)
        if "exceptionDetails" in res:
            raise PageError(f"{expression!r} threw: {json.dumps(res['exceptionDetails'])[:500]}")
        return res["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = await self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                state = await self.eval("JSON.stringify({state: streamscribe.state, errors: streamscribe.errors,"
                                        " sent: streamscribe.sentPcm, deltas: streamscribe.deltas})")
                raise AssertionError(f"timed out waiting for {what}; page state {state}; console {self.console}")
            await asyncio.sleep(0.1)


@dataclass
class Browser:
    proc: subprocess.Popen
    user_dir: Path
    cdp: Cdp | None = None

    async def new_page(self, url: str) -> Page:
        assert self.cdp is not None
        target = (await self.cdp.call("Target.createTarget", url="about:blank"))["targetId"]
        session = (await self.cdp.call("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]
        page = self.cdp.pages[session] = Page(self.cdp, session)
        await page.call("Runtime.enable")
        await page.call("Page.enable")
        await page.call("Page.navigate", url=url)
        await page.wait_for("document.readyState === 'complete' && !!window.streamscribe", 20, "the page to load")
        return page


def chromium_args(user_dir: Path, fake_audio: Path | None, extra: tuple[str, ...] = ()) -> list[str]:
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--autoplay-policy=no-user-gesture-required",
            f"--user-data-dir={user_dir}", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
    if fake_audio is not None:
        # %noloop: play the file once, then silence (Chromium loops it by default).
        args.append(f"--use-file-for-fake-audio-capture={fake_audio}%noloop")
    return args + list(extra) + ["about:blank"]


async def launch(fake_audio: Path | None = None, extra: tuple[str, ...] = ()) -> Browser:
    user_dir = Path(tempfile.mkdtemp(prefix="chromium-"))
    log_path = user_dir / "chromium.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(chromium_args(user_dir, fake_audio, extra), stdout=log, stderr=subprocess.STDOUT)
    browser = Browser(proc, user_dir)
    port_file = user_dir / "DevToolsActivePort"  # Chromium writes its port here once it listens
    deadline = time.monotonic() + 30
    while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text()[-2000:]
            await close(browser)
            raise RuntimeError(f"Chromium did not start (exit {proc.poll()}):\n{tail}")
        await asyncio.sleep(0.05)
    port, path = port_file.read_text().split()[:2]
    browser.cdp = Cdp(await websockets.connect(f"ws://127.0.0.1:{port}{path}", max_size=None))
    browser.cdp.start()
    return browser


async def close(browser: Browser) -> None:
    if browser.cdp is not None:
        await browser.cdp.ws.close()
        if browser.cdp.reader is not None:
            browser.cdp.reader.cancel()
    browser.proc.terminate()
    try:
        browser.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        browser.proc.kill()
        browser.proc.wait()
    shutil.rmtree(browser.user_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------
API_KEY = "demo-test-key"


@dataclass(frozen=True)
class Server:
    http_url: str
    ws_url: str
    model: str

    async def transcribe(self, pcm: bytes, chunk_bytes: int = 4096) -> str:
        """What a plain websocket client gets for these PCM16 bytes (sent unpaced, then read)."""
        cfg = ClientConfig(url=self.ws_url, model=self.model, api_key=API_KEY)
        return (await transcribe_pcm(cfg, pcm, chunk_bytes)).text


@pytest.fixture(scope="module")
def engine() -> Iterator[TranscriptionEngine]:
    eng = build_engine("sequential", "default", model_name=ServerSettings().served_model_names[0], max_streams=8)
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def server(engine: TranscriptionEngine) -> Iterator[Server]:
    # With an API key, so the page's key handling (models list, websocket) is exercised too.
    settings = ServerSettings(host="127.0.0.1", port=0, api_keys=(API_KEY,))
    with ServerThread(settings, engine) as srv:
        yield Server(srv.http_url, srv.ws_url, settings.served_model_names[0])


async def open_demo(browser: Browser, server: Server, key: str | None = API_KEY) -> Page:
    page = await browser.new_page(f"{server.http_url}/?debug=pcm")
    if key is not None:
        await page.eval(f"(() => {{ const k = document.getElementById('api-key'); k.value = {json.dumps(key)};"
                        " k.dispatchEvent(new Event('change')); })()")
        await page.wait_for("document.getElementById('model').value", 20, "the model list")
    return page


async def open_keyless_demo(browser: Browser, srv: ServerThread) -> Page:
    """The page of a server without API keys, with the sample's playback off."""
    page = await browser.new_page(f"{srv.http_url}/")
    await page.wait_for("document.getElementById('model').value", 20, "the model list")
    await page.eval("document.getElementById('play-aloud').checked = false")
    return page


async def pick_file(page: Page, selector: str, path: Path) -> None:
    """Choose `path` in the page's file input `selector`, as a user would (its change event fires)."""
    doc = await page.call("DOM.getDocument")
    node = await page.call("DOM.querySelector", nodeId=doc["root"]["nodeId"], selector=selector)
    await page.call("DOM.setFileInputFiles", files=[str(path)], nodeId=node["nodeId"])


def wav_pcm16(path: Path) -> np.ndarray:
    data, rate = sf.read(path, dtype="int16")
    assert rate == 16000 and data.ndim == 1, "the test WAV is 16 kHz mono"
    return data


def normalise(text: str) -> str:
    """Lower-case, punctuation stripped, whitespace collapsed."""
    return " ".join("".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split())


async def page_result(page: Page) -> dict:
    return await page.eval("""JSON.stringify({
        transcript: document.getElementById('transcript').textContent,
        text: streamscribe.text, finalText: streamscribe.finalText, done: streamscribe.done,
        state: streamscribe.state, errors: streamscribe.errors, sentPcm: streamscribe.sentPcm,
        inputRate: streamscribe.inputRate, latency: streamscribe.latency.values.length,
        pcm: streamscribe.sentPcmBase64()})""")


def _xcorr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c[k] = sum_i a[i + k] * b[i] for k in 0 .. len(a) - len(b) (FFT)."""
    n = 1 << int(np.ceil(np.log2(len(a) + len(b))))
    full = np.fft.irfft(np.fft.rfft(a, n) * np.conj(np.fft.rfft(b, n)), n)
    return full[: len(a) - len(b) + 1]


@dataclass
class Alignment:
    lags: list[int]  # where each speech window of the file sits in what the page sent (samples)
    corrs: list[float]  # normalised correlation of each window at its lag

    @property
    def jumps(self) -> int:
        return sum(abs(b - a) > 2 for a, b in zip(self.lags, self.lags[1:]))

    @property
    def anomalies(self) -> int:
        """Windows that do not match (< 0.9) plus jumps of the lag."""
        return sum(c < 0.9 for c in self.corrs) + self.jumps


def align(sent: np.ndarray, ref: np.ndarray, window: int = 4000, search: int = 2400,
          max_offset: int = 48000) -> Alignment:
    """Track the file through what the page sent, window by window.

    Reference sample i sits at sent[i + lag]; the first estimate of `lag` (up to `max_offset`
    either way: the page may start capturing late) comes from the whole file, then each window
    looks for itself within `search` samples of the previous window's lag. A resampler with the
    wrong ratio or a discontinuous phase leaves windows that correlate badly; lost or repeated
    chunks show up as jumps of the lag.
    """
    pad = max_offset
    a = np.concatenate([np.zeros(pad), sent.astype(np.float64), np.zeros(pad + window)])
    b = ref.astype(np.float64)
    lag = int(np.argmax(_xcorr(a[: len(b) + 2 * pad], b))) - pad
    out = Alignment([], [])
    for start in range(0, len(b) - window, window):
        x = b[start:start + window]
        if np.sqrt(np.mean(x ** 2)) < 300 or start + lag < 0:  # silence, or before the capture began
            continue
        lo = start + lag + pad - search  # index in `a` of offset (lag - search)
        seg = a[lo: lo + 2 * search + window]
        num = _xcorr(seg, x)
        energy = np.convolve(seg ** 2, np.ones(window), "valid")
        corr = num / np.sqrt(np.maximum(energy, 1e-9) * np.dot(x, x))
        k = int(np.argmax(corr))
        lag = lo + k - pad - start
        out.lags.append(lag)
        out.corrs.append(float(corr[k]))
    return out


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
async def run_fake_microphone(server: Server, wav: Path) -> dict:
    """Play `wav` once as Chromium's microphone through the demo page; the page's result after stop."""
    duration = len(wav_pcm16(wav)) / 16000
    browser = await launch(fake_audio=wav)
    try:
        page = await open_demo(browser, server)
        await page.eval("document.getElementById('mic-btn').click()", gesture=True)
        await page.wait_for("streamscribe.state === 'streaming'", 20, "streaming to start")
        # The fake device plays the file once from when capture opened; stop a little after its end.
        await page.wait_for(f"streamscribe.sentPcm >= {int((duration + 0.6) * 32000)}", duration + 20,
                            "the whole file to be captured")
        await page.eval("document.getElementById('stop-btn').click()", gesture=True)
        await page.wait_for("streamscribe.done || streamscribe.state === 'error'", RUN_TIMEOUT_S, "the transcript")
        return json.loads(await page_result(page))
    finally:
        await close(browser)


async def test_fake_microphone_matches_websocket_client(server: Server) -> None:
    ref = wav_pcm16(SAMPLE)
    res = await run_fake_microphone(server, SAMPLE)

    assert res["state"] == "done" and res["errors"] == [], res["errors"]
    assert res["inputRate"] and res["inputRate"] != 16000, "the worklet should have had to resample"
    assert res["transcript"] == res["text"] == res["finalText"]
    assert res["transcript"].strip(), "the page shows no text"
    assert res["latency"] > 0, "no emission delay was measured"

    sent = np.frombuffer(base64.b64decode(res["pcm"]), "<i2")
    assert len(sent) * 2 == res["sentPcm"]
    assert len(sent) >= len(ref), "the page sent less audio than the file holds"
    al = align(sent, ref)
    # The fake device starts playing when the microphone opens; the page connects its worklet after the
    # websocket handshake, so it usually misses the first fraction of a second (a negative lag). Chromium may
    # also deliver a capture buffer or two before the file starts (a small positive lag: 160 samples, one
    # 10 ms buffer, seen once in CI).
    assert len(al.lags) >= 10 and -32000 < al.lags[0] <= 1600, f"the file is not in what the page sent: {al}"
    assert float(np.median(al.corrs)) > 0.95, f"what the page sent is not the file resampled to 16 kHz: {al}"
    # Chromium's own capture path may glitch once on a loaded 2-core machine; a pattern is a bug.
    assert al.anomalies <= 3, f"the page's audio has gaps, repeats or distortion: {al}"

    # Exactly these bytes through a plain client give exactly the page's transcript.
    replay = await server.transcribe(sent.tobytes())
    assert replay == res["transcript"]
    again = await server.transcribe(sent.tobytes(), chunk_bytes=3200)
    assert again == replay, "the server is not deterministic"


async def test_held_out_voice_through_the_microphone_shows_the_right_words(server: Server) -> None:
    # A speaker the model never heard, a sentence it never saw, through the real capture path.
    res = await run_fake_microphone(server, HELDOUT)

    assert res["state"] == "done" and res["errors"] == [], res["errors"]
    assert res["transcript"] == res["text"] == res["finalText"]
    sent = np.frombuffer(base64.b64decode(res["pcm"]), "<i2")
    assert len(sent) * 2 == res["sentPcm"]
    # What a plain websocket client gets for the very bytes the page sent: if this differs from the
    # page, the page is wrong; if both differ from the sentence, the model (or the capture) is.
    replay = await server.transcribe(sent.tobytes())
    assert res["transcript"] == replay, f"page {res['transcript']!r} != websocket replay {replay!r}"
    assert normalise(res["transcript"]) == HELDOUT_TEXT, \
        f"page showed {res['transcript']!r} (websocket replay {replay!r}), expected {HELDOUT_TEXT!r}"


async def test_uploaded_file_shows_the_right_words(server: Server) -> None:
    """"Transcribe a file, fast": the page uploads the held-out voice's WAV to POST /v1/audio/transcriptions
    (stream=true) and shows the streamed text, the right words, and every word's timing; the text is what the API
    gives any client for the file."""
    browser = await launch()
    try:
        page = await open_demo(browser, server)
        await pick_file(page, "#upload-input", HELDOUT)
        await page.wait_for("streamscribe.done || streamscribe.state === 'error'", RUN_TIMEOUT_S, "the transcript")
        res = json.loads(await page.eval("""JSON.stringify({
            transcript: document.getElementById('transcript').textContent, text: streamscribe.text,
            finalText: streamscribe.finalText, state: streamscribe.state, errors: streamscribe.errors,
            mode: streamscribe.mode, words: streamscribe.words.map((w) => w.text),
            listed: document.querySelectorAll('#words li').length,
            status: document.getElementById('status').textContent})"""))
    finally:
        await close(browser)

    assert res["state"] == "done" and res["errors"] == [] and res["mode"] == "upload", res
    assert res["transcript"] == res["text"] == res["finalText"]
    assert normalise(res["transcript"]) == HELDOUT_TEXT, res["transcript"]
    assert res["words"] == res["transcript"].split() and res["listed"] == len(res["words"])
    duration = sf.info(str(HELDOUT)).duration
    assert f"{duration:.1f} s of audio" in res["status"], res["status"]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_http_transcribe import upload

    api = await asyncio.to_thread(upload, server.http_url, HELDOUT, stream=False, api_key=API_KEY, timeout=60)
    assert api.status == 200 and api.text == res["transcript"]


async def test_sample_file_matches_websocket_client(server: Server) -> None:
    ref = wav_pcm16(SAMPLE)
    browser = await launch()
    try:
        page = await open_demo(browser, server)
        await page.eval("document.getElementById('play-aloud').checked = false")
        t0 = time.monotonic()
        await page.eval("document.getElementById('sample-btn').click()", gesture=True)
        await page.wait_for("streamscribe.done || streamscribe.state === 'error'", RUN_TIMEOUT_S, "the transcript")
        elapsed = time.monotonic() - t0
        res = json.loads(await page_result(page))
    finally:
        await close(browser)

    assert res["state"] == "done" and res["errors"] == [], res["errors"]
    assert elapsed >= len(ref) / 16000 * 0.95, f"the file was not paced at real time ({elapsed:.1f} s)"
    sent = np.frombuffer(base64.b64decode(res["pcm"]), "<i2")
    np.testing.assert_array_equal(sent, ref, err_msg="the page did not send the file's samples exactly")
    assert res["transcript"] == res["text"] == res["finalText"]
    assert res["transcript"].strip()

    assert await server.transcribe(ref.tobytes()) == res["transcript"]


async def test_missing_api_key_is_reported_not_stalled(server: Server) -> None:
    browser = await launch()
    try:
        page = await open_demo(browser, server, key=None)
        await page.wait_for("streamscribe.errors.length > 0", 20, "the models error")
        shown = await page.eval("document.getElementById('error').textContent")
        assert "401" in shown and "API key" in shown
        await page.eval("document.getElementById('sample-btn').click()", gesture=True)
        await page.wait_for("streamscribe.state === 'error'", 30, "the refused connection to be reported")
        shown = await page.eval("document.getElementById('error').textContent")
        hidden = await page.eval("document.getElementById('error').hidden")
    finally:
        await close(browser)
    assert not hidden and "refused" in shown, shown


async def test_user_wav_is_decoded_resampled_and_streamed(server: Server, tmp_path: Path) -> None:
    # A 48 kHz stereo file picked by the user: the browser decodes and resamples it to 16 kHz mono.
    mono16 = synthetic_audio(3.0, seed=5)
    left = resample(mono16, 16000, 48000)
    path = tmp_path / "user.wav"
    sf.write(path, np.stack([left, 0.5 * left], axis=1), 48000, subtype="PCM_16")
    expected = load_pcm16(path)  # our own decode: channels averaged, resampled to 16 kHz

    browser = await launch()
    try:
        page = await open_demo(browser, server)
        await page.eval("document.getElementById('play-aloud').checked = false")
        await pick_file(page, "#file-input", path)
        await page.wait_for("streamscribe.done || streamscribe.state === 'error'", RUN_TIMEOUT_S, "the transcript")
        res = json.loads(await page_result(page))
    finally:
        await close(browser)

    assert res["state"] == "done" and res["errors"] == [], res["errors"]
    sent = np.frombuffer(base64.b64decode(res["pcm"]), "<i2")
    assert abs(len(sent) - len(expected)) <= 16, (len(sent), len(expected))
    al = align(sent, expected, window=2000)
    assert al.lags and set(al.lags) == {0} and min(al.corrs) > 0.99, al
    assert res["transcript"] == res["finalText"]
    assert await server.transcribe(sent.tobytes()) == res["transcript"]


async def test_server_full_and_disconnect_are_reported(engine: TranscriptionEngine) -> None:
    settings = ServerSettings(host="127.0.0.1", port=0, max_sessions=1)
    srv = ServerThread(settings, engine).start()
    browser = await launch()
    try:
        page = await open_keyless_demo(browser, srv)
        # Another client holds the only session: the server's `server_full` error event must show.
        async with websockets.connect(srv.ws_url) as other:
            await other.recv()
            await page.eval("document.getElementById('sample-btn').click()", gesture=True)
            await page.wait_for("streamscribe.state === 'error'", 30, "the server_full error")
            shown = await page.eval("document.getElementById('error').textContent")
            assert "server_full" in shown and "full" in shown.lower(), shown
        # Now the server goes away mid-stream: the page must say so, not wait forever.
        await page.eval("document.getElementById('sample-btn').click()", gesture=True)
        await page.wait_for("streamscribe.state === 'streaming' && streamscribe.deltas > 0", 30, "streaming")
        stopping = asyncio.create_task(asyncio.to_thread(srv.stop))
        await page.wait_for("streamscribe.state === 'error'", 30, "the disconnect to be reported")
        shown = await page.eval("document.getElementById('error').textContent")
        status = await page.eval("document.getElementById('status').textContent")
        await stopping
    finally:
        await close(browser)
        if srv.loop is not None and not srv.loop.is_closed():  # ServerThread.stop is not idempotent
            srv.stop()
    assert "closed" in shown.lower() and "1001" in shown, shown
    assert "error" in status.lower()


async def test_graceful_shutdown_mid_stream_shows_the_final_transcript(engine: TranscriptionEngine) -> None:
    """The server is stopped (SIGTERM's path, `shut_down`) while the page streams the sample: the page gets the
    transcript of what it sent, ends in `done` (not `error`), and says why the stream ended."""
    settings = ServerSettings(host="127.0.0.1", port=0, drain_timeout_s=0.3)
    srv = ServerThread(settings, engine).start()
    browser = await launch()
    try:
        page = await open_keyless_demo(browser, srv)
        await page.eval("document.getElementById('sample-btn').click()", gesture=True)
        await page.wait_for("streamscribe.state === 'streaming' && streamscribe.deltas > 0", 30, "streaming")
        await asyncio.wrap_future(srv.shut_down())
        await page.wait_for("streamscribe.done || streamscribe.state === 'error'", 30, "the final transcript")
        await page.wait_for("streamscribe.errors.length > 0", 10, "the shutdown notice")
        res = json.loads(await page_result(page))
    finally:
        await close(browser)
        srv.stop()
    assert res["state"] == "done", res
    assert res["finalText"] and res["transcript"] == res["finalText"]
    assert any("shutting down" in str(e) for e in res["errors"]), res["errors"]


async def test_page_over_https_streams_over_wss(engine: TranscriptionEngine) -> None:
    """Served with TLS (`--ssl-certfile`), the page streams over wss:// on its own and gets the same transcript as a
    plain client over wss. (The test certificate is self-signed: Chromium is told to accept it.)"""
    tls = Path(__file__).resolve().parent / "tls"
    settings = ServerSettings(host="127.0.0.1", port=0, tls_certfile=tls / "localhost.pem",
                              tls_keyfile=tls / "localhost-key.pem")
    srv = ServerThread(settings, engine).start()
    assert srv.http_url.startswith("https://")
    browser = await launch(extra=("--ignore-certificate-errors",))
    try:
        page = await open_keyless_demo(browser, srv)
        await page.eval("document.getElementById('sample-btn').click()", gesture=True)
        await page.wait_for("streamscribe.done || streamscribe.state === 'error'", RUN_TIMEOUT_S, "the transcript")
        res = json.loads(await page_result(page))
        scheme = await page.eval("location.protocol")
    finally:
        await close(browser)
    try:
        cfg = ClientConfig(url=srv.ws_url, model=settings.served_model_names[0], ca_file=str(tls / "localhost.pem"))
        plain = await transcribe_pcm(cfg, wav_pcm16(SAMPLE).tobytes())
    finally:
        srv.stop()
    assert scheme == "https:" and res["state"] == "done" and res["errors"] == [], res["errors"]
    assert res["transcript"].strip() and res["transcript"] == res["finalText"] == plain.text


@contextlib.contextmanager
def third_party_site(root: Path) -> Iterator[str]:
    """A web app of another origin (its own port): serves `root`; yields its origin."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    handler = functools.partial(Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_another_origins_page_uploads_only_when_allowed(engine: TranscriptionEngine, tmp_path: Path) -> None:
    """A web app on another origin calls POST /v1/audio/transcriptions with fetch and its API key: the browser's CORS
    preflight and check pass when --allowed-origins names the app, and the browser blocks it otherwise."""
    (tmp_path / "index.html").write_text("<!doctype html><title>app</title><script>window.streamscribe = {};</script>")
    shutil.copy(HELDOUT, tmp_path / "clip.wav")
    call = """(async () => {
        const clip = await (await fetch('/clip.wav')).blob();
        const form = new FormData();
        form.append('file', clip, 'clip.wav');
        form.append('response_format', 'text');
        try {
          const r = await fetch(%s, {method: 'POST', body: form, headers: {Authorization: 'Bearer %s'}});
          return JSON.stringify({status: r.status, text: await r.text()});
        } catch (err) { return JSON.stringify({blocked: String(err)}); }
    })()"""
    with third_party_site(tmp_path) as app:
        results = {}
        # (a localhost page is allowed by default, like the websocket's: the refused server lists another origin)
        for allowed in ((app,), ("https://elsewhere.example",)):
            settings = ServerSettings(host="127.0.0.1", port=0, api_keys=(API_KEY,), allowed_origins=allowed)
            with ServerThread(settings, engine) as srv:
                browser = await launch()
                try:
                    page = await browser.new_page(f"{app}/")
                    url = json.dumps(f"{srv.http_url}/v1/audio/transcriptions")
                    results[app in allowed] = json.loads(await page.eval(call % (url, API_KEY)))
                finally:
                    await close(browser)
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
        from bench_http_transcribe import upload

        settings = ServerSettings(host="127.0.0.1", port=0, api_keys=(API_KEY,))
        with ServerThread(settings, engine) as srv:
            api = await asyncio.to_thread(upload, srv.http_url, HELDOUT, stream=False, api_key=API_KEY, timeout=60)
    assert results[True].get("status") == 200, results
    assert results[True]["text"] == api.text and normalise(api.text) == HELDOUT_TEXT
    assert "blocked" in results[False], results  # the server answered 403 without CORS headers: fetch fails


async def test_stopping_an_upload_stops_the_server_work(engine: TranscriptionEngine) -> None:
    """"Stop" during an upload: the page aborts the request, says so, and the server closes the file's engine stream
    (here an engine that never decodes, so only the abort can end it)."""
    stalled = StalledEngine(engine)
    settings = ServerSettings(host="127.0.0.1", port=0, engine_stall_timeout_s=60)
    with ServerThread(settings, stalled) as srv:
        browser = await launch()
        try:
            page = await open_keyless_demo(browser, srv)
            await pick_file(page, "#upload-input", HELDOUT)
            await page.wait_for("streamscribe.state === 'streaming'", 30, "the upload to start")
            assert wait_for(lambda: bool(stalled.pending), 10), "the upload never reached the engine"
            await page.eval("document.getElementById('stop-btn').click()", gesture=True)
            await page.wait_for("streamscribe.state === 'idle'", 10, "the page to stop")
            status = await page.eval("document.getElementById('status').textContent")
        finally:
            await close(browser)
        assert status == "Cancelled."
        assert wait_for(lambda: not stalled.pending, 10), "the server kept the stopped upload's stream"

