"""Load tester: N concurrent clients stream WAV files at real time (or xR) and measure latency.

    python -m stream_server.loadtest --url ws://127.0.0.1:8000 --streams 8
    python -m stream_server.loadtest --url ws://127.0.0.1:8000 --ramp 1,2,4,8,16 --out results.json
    python -m stream_server.loadtest --url ws://127.0.0.1:8000 --search 256 --duration 30 --out results.json

What it measures, per token and per stream (all times from one monotonic clock):

* emission delay (per token): wall time the delta arrived - wall time the client sent the audio
  the token was decided on. vLLM dialect: the delta's `audio_end_ms` (stream audio the model had
  heard) names a sample; the append that carried that sample was sent at a recorded time. Tokens
  of the end-of-stream flush (audio_end_ms past the audio sent: the server's own padding) are not
  counted; their latency is the end->final time below. The transcription delay itself is not
  part of it (it is the model's look-ahead), so the text a token carries was spoken about
  delay_ms + emission delay before it appears.
  OpenAI dialect: the standard events carry no audio position. If the server adds `audio_end_ms`
  to `conversation.item.input_audio_transcription.delta` (streamscribe does), it is used the same
  way, but only tokens with text get a delta there, so the delay is sampled on text tokens only.
  Without `audio_end_ms` no per-token delay is reported (null) and only time to first text and
  end->final are measured: any other attribution of text to audio would be a guess. The session
  uses manual turns (`turn_detection: null`): one item per stream, ended by the final commit.
* time to first text: first non-empty delta - the moment the stream's first sample was "spoken"
  (its pacing start).
* end -> final: `transcription.done` (OpenAI: `...transcription.completed`) - final commit sent.
* errors (error events, failed connections, bad protocol) and rejections (`server_full`, HTTP
  503/429 on the upgrade, close code 1013) per stream.
* client send lag: how late the load generator itself sent its appends; a large value means the
  generator, not the server, is the bottleneck.

The capacity search (`--ramp` or `--search`) finds the largest stream count whose emission delay
p99 stays within the SLO (`--slo-ms`, default delay + 100 ms) with no errors or rejections.
Everything is bounded in time (per stream and `--max-time` overall); only `--url` is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import functools
import json
import logging
import math
import multiprocessing
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import numpy as np
import websockets

from .upload_client import UploadError, http_base, upload_file

logger = logging.getLogger("stream_server.loadtest")

RATE = 16000
DEFAULT_FILE = Path(__file__).resolve().parent.parent / "demo" / "samples" / "sample_en.wav"
DEFAULT_DELAY_MS = 480
REJECT_CODES = {"server_full", "server_busy", "server_shutting_down", "too_many_sessions"}  # "no room", not "bad"


# ---------------------------------------------------------------------------------------------
# Audio
# ---------------------------------------------------------------------------------------------
def load_pcm16(path: str | Path) -> np.ndarray:
    """A WAV/FLAC/Ogg/MP3 file as 16 kHz mono int16 (resampled and mixed down if needed)."""
    from realtime.audio import load_audio_file

    audio = load_audio_file(path, RATE)
    return np.clip(np.round(audio * 32768.0), -32768, 32767).astype(np.int16)


def stream_audio(files: Sequence[np.ndarray], index: int, duration_s: float | None) -> np.ndarray:
    """The audio client `index` sends: files in turn from file `index`, cut to `duration_s`."""
    first = files[index % len(files)]
    if duration_s is None:
        return first
    want = int(round(duration_s * RATE))
    parts, n, k = [], 0, index
    while n < want:
        part = files[k % len(files)]
        parts.append(part[: want - n])
        n += len(parts[-1])
        k += 1
    return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------
# Dialects
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientConfig:
    url: str  # ws://host:port (a path, if given, is kept)
    dialect: str = "vllm"  # "vllm" | "openai"
    model: str = ""
    api_key: str | None = None
    delay_ms: int = DEFAULT_DELAY_MS
    chunk_ms: int = 80
    rate: float = 1.0
    final_timeout_s: float = 60.0
    connect_timeout_s: float = 15.0
    ca_file: str | None = None  # wss:// / https://: trust this PEM (a self-signed server) instead of the system's CAs
    # a stream refused for room (REJECT_CODES) connects again after this many seconds, as a production client would,
    # for at most `retry_for_s` after its first try; 0: a refused stream stays refused
    retry_busy_s: float = 0.0
    retry_for_s: float = 30.0


def client_tls(ca_file: str | None) -> dict[str, Any]:
    """Connection keywords for a server whose certificate `ca_file` vouches for (none: the system's CAs)."""
    return {} if ca_file is None else {"ssl": ssl.create_default_context(cafile=ca_file)}


def client_keepalive(rate: float | None) -> dict[str, Any]:
    """The client's websocket keepalive for audio sent at `rate` x real time (None: unpaced, all at once).
    A client that sends faster than the server decodes is held back by the server's backpressure: the server stops
    reading, so the client's own pings wait in the socket behind its audio and a ping timeout would cut a healthy
    session (four streams at 20x to the default model on the CPU were cut after about 40 s). Such clients rely
    on the server's keepalive instead; paced clients keep the library's (a dead server is still noticed)."""
    return {"ping_interval": None} if rate is None or rate > 1.0 else {}


def endpoint(cfg: ClientConfig) -> str:
    parts = urllib.parse.urlsplit(cfg.url)
    path = parts.path if parts.path not in ("", "/") else "/v1/realtime"
    query = urllib.parse.parse_qsl(parts.query)
    if cfg.dialect == "openai" and not any(k == "intent" for k, _ in query):
        query.append(("intent", "transcription"))
    # the API key goes in an Authorization header (see run_stream), not into URLs and logs
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, urllib.parse.urlencode(query), ""))


def redacted(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = [(k, "***" if k == "api_key" else v) for k, v in urllib.parse.parse_qsl(parts.query)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def fetch_model(url: str, api_key: str | None, timeout: float = 10.0, ca_file: str | None = None) -> str:
    """The first model `/v1/models` lists ("" if the server has no such endpoint)."""
    try:
        req = urllib.request.Request(f"{http_base(url)}/v1/models")
        if api_key:
            req.add_header("Authorization", f"Bearer {api_key}")
        with urllib.request.urlopen(req, timeout=timeout, context=client_tls(ca_file).get("ssl")) as resp:
            data = json.load(resp).get("data") or []
    except (urllib.error.URLError, OSError, ValueError) as exc:
        logger.warning("could not list models (%s); sending an empty model name", exc)
        return ""
    return str(data[0]["id"]) if data else ""


def setup_events(cfg: ClientConfig) -> list[dict[str, Any]]:
    """What a client sends after `session.created`, before any audio."""
    if cfg.dialect == "openai":
        session = {
            "type": "transcription",
            "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": RATE},  # streamscribe also takes 16 kHz PCM
                "transcription": {"model": cfg.model, "transcription_delay_ms": cfg.delay_ms},
                "turn_detection": None,  # one item per stream, ended by our commit
            }},
        }
        return [{"type": "session.update", "session": session}]
    return [
        {"type": "session.update", "model": cfg.model, "transcription_delay_ms": cfg.delay_ms},
        {"type": "input_audio_buffer.commit"},  # vLLM: a non-final commit starts the utterance
    ]


def append_event(pcm: bytes) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode("ascii")}


def final_event(cfg: ClientConfig) -> dict[str, Any]:
    if cfg.dialect == "openai":
        return {"type": "input_audio_buffer.commit"}
    return {"type": "input_audio_buffer.commit", "final": True}


DELTA_TYPES = {"vllm": "transcription.delta", "openai": "conversation.item.input_audio_transcription.delta"}
DONE_TYPES = {"vllm": "transcription.done", "openai": "conversation.item.input_audio_transcription.completed"}


def done_text(msg: dict[str, Any]) -> str:
    return str(msg.get("text", msg.get("transcript", "")))


def error_code_message(msg: dict[str, Any]) -> tuple[str | None, str]:
    err = msg.get("error")
    if isinstance(err, dict):  # OpenAI shape
        return err.get("code"), str(err.get("message", err))
    return msg.get("code"), str(err)


# ---------------------------------------------------------------------------------------------
# One stream
# ---------------------------------------------------------------------------------------------
@dataclass
class StreamResult:
    index: int
    audio_s: float
    completed: bool = False
    rejected: bool = False
    errors: list[str] = field(default_factory=list)
    text: str = ""  # the done event's text
    delta_text: str = ""  # concatenation of the deltas
    tokens: int = 0  # deltas received
    delays_ms: list[float] = field(default_factory=list)  # emission delay per counted token
    ttft_ms: float | None = None
    final_ms: float | None = None
    send_lag_ms: float = 0.0  # worst lateness of an append against its schedule
    retries: int = 0  # refusals it connected again after (ClientConfig.retry_busy_s)


@dataclass
class _SendLog:
    """Cumulative samples sent and when: maps an audio time to the moment it left the client."""

    ends: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def add(self, end_sample: int, t: float) -> None:
        self.ends.append(end_sample)
        self.times.append(t)

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else 0

    def sent_at(self, sample: int) -> float | None:
        k = bisect.bisect_left(self.ends, sample)
        return self.times[k] if k < len(self.times) else None


def _is_rejection(exc: BaseException) -> bool:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (429, 503):
        return True
    rcvd = getattr(exc, "rcvd", None)
    return rcvd is not None and rcvd.code == 1013


async def run_stream_retrying(cfg: ClientConfig, pcm: np.ndarray, index: int, start_at: float,
                              clock: Callable[[], float] = time.perf_counter) -> StreamResult:
    """`run_stream`, connecting again after a refusal for room (server_busy, server_full...) every
    `cfg.retry_busy_s` for at most `cfg.retry_for_s`: the result of the last try, with its retries counted."""
    deadline, retries = start_at + cfg.retry_for_s, 0
    while True:
        res = await run_stream(cfg, pcm, index, start_at, clock)
        if not (res.rejected and cfg.retry_busy_s > 0) or clock() + cfg.retry_busy_s > deadline:
            res.retries = retries
            return res
        retries += 1
        await asyncio.sleep(cfg.retry_busy_s)
        start_at = clock()


async def run_stream(cfg: ClientConfig, pcm: np.ndarray, index: int, start_at: float,
                     clock: Callable[[], float] = time.perf_counter) -> StreamResult:
    """Connect, stream `pcm` paced at cfg.rate x real time from `start_at`, collect everything."""
    res = StreamResult(index, len(pcm) / RATE)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None
    log = _SendLog()
    done = asyncio.Event()
    final_sent: list[float] = []
    audio_t0: list[float] = []

    def on_message(raw: str | bytes, t: float) -> None:
        msg = json.loads(raw)
        kind = msg.get("type")
        if kind == DELTA_TYPES[cfg.dialect]:
            res.tokens += 1
            delta = msg.get("delta") or ""
            res.delta_text += delta
            if delta and res.ttft_ms is None and audio_t0:
                res.ttft_ms = (t - audio_t0[0]) * 1000
            end_ms = msg.get("audio_end_ms")
            if isinstance(end_ms, (int, float)):
                sample = int(round(end_ms * RATE / 1000))
                # After the final commit, tokens at the end of the audio come from the server's
                # flush padding (streamscribe clamps their audio_end_ms to the audio received).
                flush = bool(final_sent) and sample >= log.total
                sent = log.sent_at(sample)
                if sent is not None and not flush:
                    res.delays_ms.append((t - sent) * 1000)
        elif kind == DONE_TYPES[cfg.dialect]:
            res.text = done_text(msg)
            if final_sent:
                res.final_ms = (t - final_sent[0]) * 1000
            res.completed = True
            done.set()
        elif kind == "error" or kind == "conversation.item.input_audio_transcription.failed":
            code, message = error_code_message(msg)
            if code in REJECT_CODES:
                res.rejected = True
            res.errors.append(f"{code}: {message}")
            done.set()  # no done follows an error that matters; the stream is over

    async def receive(ws) -> None:
        async for raw in ws:
            on_message(raw, clock())
            if done.is_set():
                return

    async def send(ws) -> None:
        step = max(1, int(RATE * cfg.chunk_ms / 1000))
        t0 = max(start_at, clock())
        audio_t0.append(t0)
        for start in range(0, len(pcm), step):
            end = min(len(pcm), start + step)
            due = t0 + end / RATE / cfg.rate  # a chunk leaves once its last sample was "spoken"
            await asyncio.sleep(max(0.0, due - clock()))
            await ws.send(json.dumps(append_event(pcm[start:end].astype("<i2").tobytes())))
            now = clock()
            res.send_lag_ms = max(res.send_lag_ms, (now - due) * 1000)
            log.add(end, now)
        await ws.send(json.dumps(final_event(cfg)))
        final_sent.append(clock())

    await asyncio.sleep(max(0.0, start_at - clock()))
    budget = len(pcm) / RATE / cfg.rate + cfg.connect_timeout_s + cfg.final_timeout_s
    try:
        async with asyncio.timeout(budget):
            async with websockets.connect(endpoint(cfg), additional_headers=headers, max_size=None,
                                          open_timeout=cfg.connect_timeout_s, **client_keepalive(cfg.rate),
                                          **client_tls(cfg.ca_file)) as ws:
                first = json.loads(await ws.recv())
                if first.get("type") == "error":
                    on_message(json.dumps(first), clock())
                    return res
                if first.get("type") != "session.created":
                    res.errors.append(f"protocol: expected session.created, got {first.get('type')!r}")
                    return res
                for event in setup_events(cfg):
                    await ws.send(json.dumps(event))
                receiver = asyncio.create_task(receive(ws))
                sender = asyncio.create_task(send(ws))
                await asyncio.wait({receiver, sender}, return_when=asyncio.FIRST_COMPLETED)
                if sender.done() and sender.exception() is None:
                    await receiver  # the done event, an error, or the socket closing
                else:
                    # the stream ended early (an error event, or a send failed): stop sending
                    sender.cancel()
                    await asyncio.gather(sender, return_exceptions=True)
                    for task in (receiver, sender):
                        if task.done() and not task.cancelled() and task.exception() is not None:
                            raise task.exception()
                    await receiver
    except TimeoutError:
        res.errors.append(f"timeout: no final transcript within {budget:.0f} s")
    except websockets.ConnectionClosed as exc:
        if _is_rejection(exc):
            res.rejected = True
        if not res.completed and not res.errors:
            res.errors.append(f"closed: {exc}")
    except (OSError, websockets.InvalidHandshake) as exc:
        if _is_rejection(exc):
            res.rejected = True
        res.errors.append(f"connect: {exc}")
    if res.completed and res.text != res.delta_text:
        res.errors.append("protocol: the done text differs from the concatenated deltas")
    if not res.completed and not res.errors:
        res.errors.append("closed: the server closed the socket before the final transcript")
    return res


async def transcribe_pcm(cfg: ClientConfig, pcm: bytes, chunk_bytes: int = 4096) -> StreamResult:
    """The single-client reference: everything sent unpaced before reading (vLLM's example client)."""
    res = StreamResult(0, len(pcm) / 2 / RATE)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None
    async with asyncio.timeout(cfg.connect_timeout_s + cfg.final_timeout_s + len(pcm) / 2 / RATE):
        async with websockets.connect(endpoint(cfg), additional_headers=headers, max_size=None,
                                      **client_keepalive(None), **client_tls(cfg.ca_file)) as ws:
            first = json.loads(await ws.recv())
            if first.get("type") != "session.created":
                raise RuntimeError(f"expected session.created, got {first}")
            for event in setup_events(cfg):
                await ws.send(json.dumps(event))
            for i in range(0, len(pcm), chunk_bytes):
                await ws.send(json.dumps(append_event(pcm[i:i + chunk_bytes])))
            await ws.send(json.dumps(final_event(cfg)))
            async for raw in ws:
                msg = json.loads(raw)
                if msg.get("type") == DELTA_TYPES[cfg.dialect]:
                    res.tokens += 1
                    res.delta_text += msg.get("delta") or ""
                elif msg.get("type") == DONE_TYPES[cfg.dialect]:
                    res.text, res.completed = done_text(msg), True
                    return res
                elif msg.get("type") == "error":
                    code, message = error_code_message(msg)
                    raise RuntimeError(f"server error {code}: {message}")
    raise RuntimeError("the server closed the socket before the final transcript")


# ---------------------------------------------------------------------------------------------
# A level: N streams at once
# ---------------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None when there are no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return float(s[k])


@dataclass
class LevelSummary:
    streams: int
    completed: int = 0
    rejected: int = 0  # streams never admitted (after their retries, with --retry-busy)
    retries: int = 0  # refusals that a stream connected again after (--retry-busy)
    errors: int = 0  # streams with an error (rejections included)
    tokens: int = 0
    delay_samples: int = 0
    delay_p50_ms: float | None = None
    delay_p90_ms: float | None = None
    delay_p99_ms: float | None = None
    delay_max_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    final_p50_ms: float | None = None
    final_p99_ms: float | None = None
    send_lag_max_ms: float = 0.0
    audio_s: float = 0.0
    wall_s: float = 0.0
    passes_slo: bool = False


def passes_slo(s: LevelSummary, slo_ms: float) -> bool:
    """Every stream finished without errors and the emission delay p99 is within the SLO."""
    return (s.completed == s.streams and s.errors == 0 and s.rejected == 0
            and s.delay_p99_ms is not None and s.delay_p99_ms <= slo_ms)


def summarize(results: Sequence[StreamResult], wall_s: float, slo_ms: float) -> LevelSummary:
    delays = [d for r in results for d in r.delays_ms]
    ttft = [r.ttft_ms for r in results if r.ttft_ms is not None]
    final = [r.final_ms for r in results if r.final_ms is not None]
    s = LevelSummary(
        streams=len(results),
        completed=sum(r.completed for r in results),
        rejected=sum(r.rejected for r in results),
        retries=sum(r.retries for r in results),
        errors=sum(bool(r.errors) for r in results),
        tokens=sum(r.tokens for r in results),
        delay_samples=len(delays),
        delay_p50_ms=percentile(delays, 50),
        delay_p90_ms=percentile(delays, 90),
        delay_p99_ms=percentile(delays, 99),
        delay_max_ms=max(delays) if delays else None,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p99_ms=percentile(ttft, 99),
        final_p50_ms=percentile(final, 50),
        final_p99_ms=percentile(final, 99),
        send_lag_max_ms=max((r.send_lag_ms for r in results), default=0.0),
        audio_s=sum(r.audio_s for r in results),
        wall_s=wall_s,
    )
    s.passes_slo = passes_slo(s, slo_ms)
    return s


@dataclass
class LevelResult:
    summary: LevelSummary
    streams: list[StreamResult]
    uploads: UploadSummary | None = None  # `--uploads`: the file transcriptions that ran beside the streams


@dataclass
class UploadSummary:
    in_flight: int  # requests kept running at once
    completed: int
    errors: int
    error_codes: dict[str, int]
    audio_s: float  # audio of the completed requests
    wall_s: float  # from the level's start until the last request returned
    median_request_s: float | None

    @property
    def x_real_time(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s > 0 else 0.0


class UploadLoad:
    """`--uploads N`: N file transcriptions (POST /v1/audio/transcriptions) kept in flight while a level runs, each
    client uploading the files in turn; `stop` lets the running requests finish and sums them up."""

    def __init__(self, n: int, paths: Sequence[str], url: str, api_key: str | None, ca_file: str | None,
                 timeout_s: float) -> None:
        self.n, self.paths, self.url = n, [Path(p) for p in paths], url
        self.api_key, self.ca_file, self.timeout_s = api_key, ca_file, timeout_s
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = 0.0
        self._seconds: list[float] = []
        self._audio = 0.0
        self._errors: dict[str, int] = {}

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.n)]

    async def _client(self, i: int) -> None:
        k = i
        while not self._stop:
            path = self.paths[k % len(self.paths)]
            k += self.n
            try:
                r = await asyncio.to_thread(upload_file, self.url, path, api_key=self.api_key, ca_file=self.ca_file,
                                            timeout=self.timeout_s)
            except UploadError as exc:
                self._errors[exc.code or str(exc.status)] = self._errors.get(exc.code or str(exc.status), 0) + 1
                await asyncio.sleep(0.5)  # a refusal (server_busy...) is retried, not hammered
                continue
            except OSError as exc:
                self._errors[type(exc).__name__] = self._errors.get(type(exc).__name__, 0) + 1
                await asyncio.sleep(0.5)
                continue
            self._seconds.append(r.seconds)
            self._audio += float(r.body.get("usage", {}).get("seconds", 0.0))

    async def stop(self) -> UploadSummary:
        self._stop = True
        await asyncio.gather(*self._tasks)
        secs = sorted(self._seconds)
        return UploadSummary(self.n, len(secs), sum(self._errors.values()), dict(self._errors), round(self._audio, 3),
                             round(time.perf_counter() - self._t0, 3), secs[len(secs) // 2] if secs else None)


def start_time(t0: float, stagger_ms: float, i: int, n: int) -> float:
    """When stream i of a level of n starts: starts spread evenly over `stagger_ms` from `t0`."""
    return t0 + stagger_ms / 1000 * i / max(1, n)


async def run_level(cfg: ClientConfig, audios: Sequence[np.ndarray], n: int, *, slo_ms: float,
                    stagger_ms: float = 0.0, progress_s: float = 5.0) -> LevelResult:
    """N streams at once (starts spread over `stagger_ms` so clients do not move in lockstep)."""
    t0 = time.perf_counter() + 0.05
    tasks = [asyncio.create_task(run_stream_retrying(cfg, audios[i], i, start_time(t0, stagger_ms, i, n)))
             for i in range(n)]
    longest = max(len(a) for a in audios[:n]) / RATE / cfg.rate

    async def report() -> None:
        while True:
            await asyncio.sleep(progress_s)
            elapsed = time.perf_counter() - t0
            finished = sum(t.done() for t in tasks)
            logger.info("%d streams: %.0f/%.0f s of audio time, %d finished", n, min(elapsed, longest), longest,
                        finished)

    reporter = asyncio.create_task(report())
    try:
        results = list(await asyncio.gather(*tasks))
    finally:
        reporter.cancel()
    return LevelResult(summarize(results, time.perf_counter() - t0, slo_ms), results)


@functools.lru_cache(maxsize=4)
def _files(paths: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    return tuple(load_pcm16(p) for p in paths)


def _run_shard(cfg: ClientConfig, paths: tuple[str, ...], duration_s: float | None, indices: list[int], n: int,
               t0: float, stagger_ms: float) -> list[StreamResult]:
    """A worker process's clients of one level: streams `indices` of `n`, on the level's schedule (`t0`
    is a `time.perf_counter` instant, which is the system's monotonic clock, the same in every process)."""
    files = _files(paths)

    async def shard() -> list[StreamResult]:
        return list(await asyncio.gather(*(
            run_stream_retrying(cfg, stream_audio(files, i, duration_s), i, start_time(t0, stagger_ms, i, n))
            for i in indices)))

    return asyncio.run(shard())


class ClientProcesses:
    """Worker processes that run a level's clients between them, so that the load generator is not the
    bottleneck: one Python process holds a few hundred paced clients before its own event loop makes them
    late (their send lag grows and the delays it measures include its own queueing). Stream i runs in
    worker i mod P; every client measures against its own process's clock readings."""

    def __init__(self, processes: int, paths: Sequence[str], duration_s: float | None) -> None:
        self.processes, self.paths, self.duration_s = processes, tuple(str(p) for p in paths), duration_s
        # spawn, not fork: the parent runs an event loop
        self.pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
        # start every worker and load the audio there now, not inside the first level's schedule
        list(self.pool.map(_files, [self.paths] * processes))

    async def run_level(self, cfg: ClientConfig, n: int, *, slo_ms: float, stagger_ms: float = 0.0,
                        start_margin_s: float = 1.0) -> LevelResult:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter() + start_margin_s  # the workers have this long to pick up their shard
        shards = [list(range(k, n, self.processes)) for k in range(min(self.processes, n))]
        parts = await asyncio.gather(*(
            loop.run_in_executor(self.pool, _run_shard, cfg, self.paths, self.duration_s, idx, n, t0, stagger_ms)
            for idx in shards))
        results = sorted((r for part in parts for r in part), key=lambda r: r.index)
        return LevelResult(summarize(results, time.perf_counter() - t0, slo_ms), results)

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


# ---------------------------------------------------------------------------------------------
# Capacity search
# ---------------------------------------------------------------------------------------------
@dataclass
class SearchOutcome:
    best: int  # largest stream count that met the SLO (0: none did)
    tried: list[int]  # stream counts in the order they were measured
    exhausted: bool = False  # stopped by the time budget before the answer was certain


async def search_capacity(measure: Callable[[int], Awaitable[LevelSummary]], slo_ms: float, *,
                          levels: Sequence[int] | None = None, max_streams: int = 1024,
                          deadline: float | None = None,
                          clock: Callable[[], float] = time.monotonic) -> SearchOutcome:
    """Largest N whose level passes the SLO, assuming that more streams never do better.

    With `levels` (a ramp): measure them in ascending order and stop at the first failure.
    Without: double from 1 until a level fails (or `max_streams` passes), then bisect between the
    last pass and the first failure. Each N is measured at most once.
    """
    seen: dict[int, bool] = {}
    tried: list[int] = []

    async def ok(n: int) -> bool:
        if n not in seen:
            summary = await measure(n)
            seen[n] = passes_slo(summary, slo_ms)
            tried.append(n)
        return seen[n]

    def out_of_time() -> bool:
        return deadline is not None and clock() >= deadline

    if levels is not None:
        best = 0
        for n in sorted(set(levels)):
            if out_of_time():
                return SearchOutcome(best, tried, exhausted=True)
            if not await ok(n):
                break
            best = n
        return SearchOutcome(best, tried)

    lo, hi = 0, None  # lo passes (0 trivially), hi fails
    n = 1
    while n <= max_streams:
        if out_of_time():
            return SearchOutcome(lo, tried, exhausted=True)
        if await ok(n):
            lo = n
            if n == max_streams:
                break
            n = min(2 * n, max_streams)
        else:
            hi = n
            break
    if hi is None:
        return SearchOutcome(lo, tried)
    while hi - lo > 1:
        if out_of_time():
            return SearchOutcome(lo, tried, exhausted=True)
        mid = (lo + hi) // 2
        if await ok(mid):
            lo = mid
        else:
            hi = mid
    return SearchOutcome(lo, tried)


# ---------------------------------------------------------------------------------------------
# Report: JSON, table, plots
# ---------------------------------------------------------------------------------------------
def level_json(level: LevelResult) -> dict[str, Any]:
    return {
        "streams": level.summary.streams,
        "summary": asdict(level.summary),
        "delays_ms": [round(d, 3) for r in level.streams for d in r.delays_ms],
        "stream_results": [
            {k: v for k, v in asdict(r).items() if k != "delays_ms"} | {"delay_samples": len(r.delays_ms)}
            for r in level.streams
        ],
        "uploads": None if level.uploads is None else asdict(level.uploads) | {
            "x_real_time": round(level.uploads.x_real_time, 3)},
    }


def print_table(levels: Sequence[LevelResult], slo_ms: float, out: Any = None) -> None:
    out = sys.stdout if out is None else out  # looked up now: sys.stdout may have been replaced since import
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    head = (f"{'streams':>7} {'done':>5} {'rej':>4} {'err':>4} {'tokens':>7} {'p50':>6} {'p90':>6} {'p99':>6} "
            f"{'max':>6} {'ttft50':>7} {'final50':>8} {'final99':>8} {'lag':>5}  SLO p99<={slo_ms:.0f}ms")
    print("emission delay (ms) per token; ttft = time to first text; final = end of audio -> final", file=out)
    print(head, file=out)
    for lv in levels:
        s = lv.summary
        print(f"{s.streams:>7} {s.completed:>5} {s.rejected:>4} {s.errors:>4} {s.tokens:>7} {ms(s.delay_p50_ms):>6} "
              f"{ms(s.delay_p90_ms):>6} {ms(s.delay_p99_ms):>6} {ms(s.delay_max_ms):>6} {ms(s.ttft_p50_ms):>7} "
              f"{ms(s.final_p50_ms):>8} {ms(s.final_p99_ms):>8} {s.send_lag_max_ms:>5.0f}  "
              f"{'pass' if s.passes_slo else 'FAIL'}", file=out)
    for lv in levels:
        u = lv.uploads
        if u is not None:
            med = "-" if u.median_request_s is None else f"{u.median_request_s:.1f}"
            codes = ", ".join(f"{c} {k}" for c, k in sorted(u.error_codes.items()))
            print(f"beside {lv.summary.streams} streams: {u.completed} uploads ({u.in_flight} in flight), "
                  f"{u.audio_s:.0f} s of audio at {u.x_real_time:.1f}x real time, median request {med} s, "
                  f"{u.errors} refused or failed{f' ({codes})' if codes else ''}", file=out)


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plots(levels: Sequence[LevelResult], slo_ms: float, prefix: Path) -> list[Path]:
    """Latency CDF per level and p50/p99 vs streams; [] when matplotlib is not installed."""
    if not plots_available():
        logger.warning("matplotlib is not installed: no plots (pip install 'streamscribe[loadtest]')")
        return []
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for lv in levels:
        d = np.sort([x for r in lv.streams for x in r.delays_ms])
        if d.size:
            n = lv.summary.streams
            ax.plot(d, np.arange(1, d.size + 1) / d.size, label=f"{n} stream{'s' if n != 1 else ''}")
    ax.axvline(slo_ms, color="k", linestyle="--", linewidth=1, label=f"SLO {slo_ms:.0f} ms")
    ax.set(xlabel="emission delay (ms)", ylabel="fraction of tokens", title="Emission delay CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(prefix.with_name(prefix.name + "_cdf.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)

    pts = sorted((lv.summary.streams, lv.summary.delay_p50_ms, lv.summary.delay_p99_ms) for lv in levels
                 if lv.summary.delay_p99_ms is not None)
    if pts:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ns = [p[0] for p in pts]
        ax.plot(ns, [p[1] for p in pts], "o-", label="p50")
        ax.plot(ns, [p[2] for p in pts], "s-", label="p99")
        ax.axhline(slo_ms, color="k", linestyle="--", linewidth=1, label=f"SLO {slo_ms:.0f} ms")
        ax.set(xlabel="concurrent streams", ylabel="emission delay (ms)", title="Emission delay vs streams")
        if len(ns) > 1 and ns[-1] / max(1, ns[0]) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns, [str(n) for n in ns])  # stream counts, not powers of two
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(prefix.with_name(prefix.name + "_vs_streams.png"))
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return paths


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m stream_server.loadtest", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="ws://127.0.0.1:8000", help="server address (ws://HOST:PORT[/path])")
    ap.add_argument("--dialect", choices=("vllm", "openai"), default="vllm")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--ca-file", default=None,
                    help="wss:// to a server with a self-signed or private certificate: trust this PEM file")
    ap.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    ap.add_argument("--files", nargs="+", default=[str(DEFAULT_FILE)], help="WAV/FLAC/Ogg/MP3 files, used in turn")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of audio per stream (files repeated or cut; default: one file)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--streams", type=int, default=None, help="one level with this many streams (default 1)")
    group.add_argument("--ramp", default=None, help="comma-separated stream counts, stop at the first SLO miss")
    group.add_argument("--search", type=int, default=None, metavar="MAX",
                       help="double then bisect up to MAX streams for the largest count within the SLO")
    ap.add_argument("--rate", type=float, default=1.0, help="audio sent at this multiple of real time")
    ap.add_argument("--delay-ms", type=int, default=DEFAULT_DELAY_MS, help="transcription delay asked for")
    ap.add_argument("--slo-ms", type=float, default=None, help="emission delay p99 bound (default delay + 100)")
    ap.add_argument("--chunk-ms", type=int, default=80, help="audio per append message")
    ap.add_argument("--stagger-ms", type=float, default=500.0, help="spread stream starts over this long")
    ap.add_argument("--final-timeout", type=float, default=60.0, help="max wait for the final transcript (s)")
    ap.add_argument("--retry-busy", type=float, default=0.0, metavar="S",
                    help="a stream refused for room (server_busy, server_full, ...) connects again after S seconds, "
                         "for at most --retry-for seconds; 0 (default): it stays refused")
    ap.add_argument("--retry-for", type=float, default=30.0, help="how long a refused stream keeps retrying (s)")
    ap.add_argument("--max-time", type=float, default=3600.0, help="stop the ramp/search after this long (s)")
    ap.add_argument("--processes", type=int, default=1,
                    help="client processes sharing each level's streams (one process holds a few hundred "
                         "paced clients before it falls behind: watch the lag column)")
    ap.add_argument("--uploads", type=int, default=0,
                    help="also keep this many file transcriptions (POST /v1/audio/transcriptions) running during "
                         "each level: live latency next to uploads")
    ap.add_argument("--upload-files", nargs="+", default=None, help="files to upload (default: --files)")
    ap.add_argument("--out", type=Path, default=None, help="JSON results file (plots go beside it)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    if args.rate <= 0 or (args.duration is not None and args.duration <= 0) or args.chunk_ms <= 0:
        ap.error("--rate, --duration and --chunk-ms must be positive")
    if args.streams is not None and args.streams < 1:
        ap.error("--streams must be at least 1")
    if args.ramp is not None:
        try:
            args.ramp = [int(x) for x in args.ramp.split(",") if x.strip()]
        except ValueError:
            ap.error("--ramp takes comma-separated integers, e.g. 1,2,4,8")
        if not args.ramp or min(args.ramp) < 1:
            ap.error("--ramp needs stream counts >= 1")
    if args.search is not None and args.search < 1:
        ap.error("--search needs a maximum >= 1")
    if args.processes < 1:
        ap.error("--processes must be at least 1")
    if args.uploads < 0:
        ap.error("--uploads must be >= 0")
    return args


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[LevelResult]]:
    """Runs the levels the arguments ask for; returns the JSON report and the raw levels."""
    slo_ms = args.slo_ms if args.slo_ms is not None else args.delay_ms + 100.0
    model = args.model if args.model is not None else fetch_model(args.url, args.api_key, ca_file=args.ca_file)
    cfg = ClientConfig(url=args.url, dialect=args.dialect, model=model, api_key=args.api_key,
                       delay_ms=args.delay_ms, chunk_ms=args.chunk_ms, rate=args.rate,
                       retry_busy_s=args.retry_busy, retry_for_s=args.retry_for,
                       final_timeout_s=args.final_timeout, ca_file=args.ca_file)
    files = [load_pcm16(f) for f in args.files]
    levels: list[LevelResult] = []
    audio_cache: dict[int, np.ndarray] = {}

    def audio_for(i: int) -> np.ndarray:
        if i not in audio_cache:
            audio_cache[i] = stream_audio(files, i, args.duration)
        return audio_cache[i]

    workers = ClientProcesses(args.processes, args.files, args.duration) if args.processes > 1 else None

    async def measure(n: int) -> LevelSummary:
        logger.info("level: %d concurrent stream(s)%s", n, f" and {args.uploads} upload(s)" if args.uploads else "")
        uploads = None
        if args.uploads:
            uploads = UploadLoad(args.uploads, args.upload_files or args.files, args.url, args.api_key, args.ca_file,
                                 timeout_s=max(600.0, args.final_timeout))
            uploads.start()
        if workers is not None:
            level = await workers.run_level(cfg, n, slo_ms=slo_ms, stagger_ms=args.stagger_ms)
        else:
            level = await run_level(cfg, [audio_for(i) for i in range(n)], n, slo_ms=slo_ms,
                                    stagger_ms=args.stagger_ms)
        if uploads is not None:
            level.uploads = await uploads.stop()
        levels.append(level)
        s = level.summary
        logger.info("%d streams: p99 %s ms, %d errors, %d rejected, %d retries -> %s", n,
                    "-" if s.delay_p99_ms is None else f"{s.delay_p99_ms:.0f}", s.errors, s.rejected, s.retries,
                    "pass" if s.passes_slo else "fail")
        return s

    started = time.time()
    deadline = time.monotonic() + args.max_time
    try:
        if args.ramp is not None:
            outcome = await search_capacity(measure, slo_ms, levels=args.ramp, deadline=deadline)
            mode = "ramp"
        elif args.search is not None:
            outcome = await search_capacity(measure, slo_ms, max_streams=args.search, deadline=deadline)
            mode = "search"
        else:
            n = args.streams or 1
            s = await measure(n)
            outcome = SearchOutcome(n if s.passes_slo else 0, [n])
            mode = "streams"
    finally:
        if workers is not None:
            workers.close()
    levels.sort(key=lambda lv: lv.summary.streams)
    report = {
        "tool": "stream_server.loadtest",
        "config": {
            "url": redacted(endpoint(cfg)), "dialect": cfg.dialect, "model": model,
            "files": [str(f) for f in args.files], "duration_s": args.duration, "rate": cfg.rate,
            "delay_ms": cfg.delay_ms, "chunk_ms": cfg.chunk_ms, "stagger_ms": args.stagger_ms, "mode": mode,
            "ramp": args.ramp, "search_max": args.search, "processes": args.processes,
            "uploads": args.uploads, "upload_files": args.upload_files,
        },
        "slo": {"metric": "emission delay p99 (ms)", "threshold_ms": slo_ms},
        "max_streams_within_slo": outcome.best,
        "tried": outcome.tried,
        "budget_exhausted": outcome.exhausted,
        "started_unix": started,
        "wall_s": time.time() - started,
        "levels": [level_json(lv) for lv in levels],
    }
    return report, levels


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    report, levels = asyncio.run(run(args))
    slo_ms = report["slo"]["threshold_ms"]
    print_table(levels, slo_ms)
    print(f"largest stream count within the SLO: {report['max_streams_within_slo']}"
          f"{' (time budget ran out)' if report['budget_exhausted'] else ''}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        logger.info("wrote %s", args.out)
        if not args.no_plots:
            for p in write_plots(levels, slo_ms, args.out.with_suffix("")):
                logger.info("wrote %s", p)
    failed = any(lv.summary.errors for lv in levels)
    return 1 if failed and args.ramp is None and args.search is None else 0


if __name__ == "__main__":
    raise SystemExit(main())
