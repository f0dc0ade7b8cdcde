"""`POST /v1/audio/transcriptions`: OpenAI's file transcription endpoint, served by the streaming engine.

The upload (multipart/form-data, as the OpenAI SDK's `client.audio.transcriptions.create`, curl -F and
browsers send it) is decoded (WAV, FLAC, Ogg Vorbis/Opus, MP3; any rate, any channels) and becomes one engine
stream, handed its audio in pieces ahead of the decoding (`TranscriptionJob`), then finished. The engine decodes it
as fast as it can, speculating with its drafter when it has one. The words are the ones a websocket session would
get.

Form fields: `file` (required), `model` (a served name; default the first), `response_format` (`json`,
`text`, `srt`, `vtt`, `verbose_json`), `timestamp_granularities[]` (`segment`, `word`; verbose_json only),
`stream` (`true`: server-sent `transcript.text.delta` events, then `transcript.text.done`; json and text
only), `language` (accepted; the model transcribes what it hears), `temperature` (0 only: decoding is
greedy), `chunking_strategy` (`auto` only), and our `transcription_delay_ms`. A field it cannot honour
(`prompt`, `include[]`, an unknown name) gets a 400 that names it: nothing a client sent is ignored.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from realtime.audio import AudioError, AudioTooLong, decode_audio_bytes
from realtime.subtitles import format_srt, format_vtt, subtitle_cues
from realtime.timestamps import Word

from .engine_stream import SAMPLE_RATE, EngineStream, StreamOutcome, TokenUpdate
from .events import ProtocolError
from .http_connection import EVENT_STREAM, HttpReply
from .http_requests import HttpError
from .multipart import FormPart, parse_form
from .options import parse_delay_ms

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
STREAMABLE_FORMATS = ("json", "text")
GRANULARITIES = ("segment", "word")
# verbose_json segments: cut at a pause, or before a segment would pass this long or this many characters
SEGMENT_GAP_MS, SEGMENT_MAX_MS, SEGMENT_MAX_CHARS = 800, 30_000, 400
_FIELDS = frozenset({"file", "model", "language", "prompt", "response_format", "temperature", "stream",
                     "timestamp_granularities[]", "timestamp_granularities", "chunking_strategy",
                     "transcription_delay_ms"})
_TRUE, _FALSE = frozenset({"true", "1"}), frozenset({"false", "0", ""})
# the audio goes to the engine in pieces, while it owes less than this much of it
PUSH_CHUNK_S, MAX_PENDING_S, PENDING_POLL_S = 10.0, 30.0, 0.05


@dataclass(frozen=True)
class TranscriptionRequest:
    """A validated upload, before its audio is decoded."""

    file: FormPart
    model: str
    response_format: str = "json"
    stream: bool = False
    granularities: tuple[str, ...] = ()
    language: str | None = None
    delay_ms: int | None = None


@dataclass
class TranscriptionResult:
    text: str
    words: list[Word]
    tokens: list[tuple[int, int]]  # (token id, start ms) of every token that carried text
    duration_s: float
    prompt_tokens: int
    completion_tokens: int


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> ProtocolError:
    return ProtocolError(code, message, param=param)


def parse_request(parts: list[FormPart], served: tuple[str, ...]) -> TranscriptionRequest:
    """Validate the form; ProtocolError (a 400, or 404 for `model_not_found`) names the field at fault."""
    fields: dict[str, list[FormPart]] = {}
    for part in parts:
        fields.setdefault(part.name, []).append(part)
    for name in fields:
        if name not in _FIELDS:
            raise _bad(f"unknown or unsupported parameter {name!r}", name, "unknown_parameter")
    for name, values in fields.items():
        if len(values) > 1 and not name.startswith("timestamp_granularities"):
            raise _bad(f"{name} was given {len(values)} times", name)

    def text(name: str) -> str | None:
        return fields[name][0].text().strip() if name in fields else None

    if "file" not in fields or fields["file"][0].filename is None and not fields["file"][0].data:
        raise _bad("file is required: the audio to transcribe (multipart field 'file')", "file",
                   "missing_required_parameter")
    model = text("model") or served[0]
    if model not in served:
        raise ProtocolError("model_not_found", f"The model `{model}` does not exist (served: {', '.join(served)})",
                            param="model")
    fmt = text("response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise _bad(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got {fmt!r}", "response_format")
    stream_text = (text("stream") or "").lower()
    if stream_text not in _TRUE | _FALSE:
        raise _bad(f"stream must be true or false, got {stream_text!r}", "stream")
    stream = stream_text in _TRUE
    if stream and fmt not in STREAMABLE_FORMATS:
        raise _bad(f"stream=true works with response_format {' or '.join(STREAMABLE_FORMATS)}, not {fmt}", "stream")
    granularities: list[str] = []
    for name in ("timestamp_granularities[]", "timestamp_granularities"):
        for part in fields.get(name, []):
            for g in part.text().replace(",", " ").split():
                if g not in GRANULARITIES:
                    raise _bad(f"timestamp_granularities must be segment and/or word, got {g!r}", name)
                if g not in granularities:
                    granularities.append(g)
    if granularities and fmt != "verbose_json":
        raise _bad("timestamp_granularities needs response_format=verbose_json", "timestamp_granularities[]")
    temperature = text("temperature")
    if temperature:
        try:
            t = float(temperature)
        except ValueError:
            raise _bad(f"temperature must be a number, got {temperature!r}", "temperature") from None
        if t != 0.0:
            raise _bad("only temperature 0 is supported: the server decodes greedily (the same words every time)",
                       "temperature", "unsupported_value")
    if text("prompt"):
        raise _bad("prompt is not supported: the model has no text prompt input", "prompt", "unsupported_value")
    chunking = text("chunking_strategy")
    if chunking and chunking != "auto":
        raise _bad("chunking_strategy may only be 'auto': the model transcribes the whole file as one stream",
                   "chunking_strategy", "unsupported_value")
    delay = None
    raw_delay = text("transcription_delay_ms")
    if raw_delay:
        try:
            value: object = int(raw_delay)
        except ValueError:
            value = raw_delay
        delay = parse_delay_ms(value, "transcription_delay_ms")
    language = text("language") or None
    if language is not None and (len(language) > 32 or not language.replace("-", "").replace("_", "").isalpha()):
        raise _bad(f"language must be a language code such as 'en', got {language[:40]!r}", "language")
    return TranscriptionRequest(fields["file"][0], model, fmt, stream, tuple(granularities), language, delay)


OnToken = Callable[[TokenUpdate], None]
OnEnd = Callable[[StreamOutcome], None]
# the server's way to open an upload's engine stream: (delay_ms, on_token, on_end); AdmissionError when full
OpenStream = Callable[[int | None, OnToken, OnEnd], EngineStream]


class TranscriptionJob:
    """One upload on the engine: push all audio, finish, collect tokens and the outcome (on the event loop)."""

    def __init__(self, open_stream: OpenStream, delay_ms: int | None, audio: np.ndarray, *,
                 on_text: Callable[[str], None] | None = None) -> None:
        self.audio = audio
        self._on_text = on_text
        self._tokens: list[tuple[int, int]] = []
        self._done: asyncio.Future[StreamOutcome] = asyncio.get_running_loop().create_future()
        self.stream = open_stream(delay_ms, self._on_token, self._on_end)  # AdmissionError / ConfigError

    def _on_token(self, up: TokenUpdate) -> None:
        if up.text:
            self._tokens.append((up.token_id, up.start_ms))
            if self._on_text is not None:
                self._on_text(up.text)

    def _on_end(self, outcome: StreamOutcome) -> None:
        if not self._done.done():
            self._done.set_result(outcome)

    async def run(self, stall_timeout_s: float) -> TranscriptionResult:
        """Hand the audio over PUSH_CHUNK_S at a time while the engine owes less than MAX_PENDING_S of it (so that
        its queues and front-end buffers stay small however long the file), finish, and wait for the outcome."""
        try:
            step = int(PUSH_CHUNK_S * SAMPLE_RATE)
            for start in range(0, self.audio.size, step):
                while not self._done.done() and self.stream.pending_audio_seconds() > MAX_PENDING_S:
                    await self._wait(stall_timeout_s, PENDING_POLL_S)
                if self._done.done():  # the model ended the stream early (its end token): the rest is not decoded
                    break
                self.stream.push(self.audio[start:start + step])
            self.stream.finish()
            while not self._done.done():
                await self._wait(stall_timeout_s, 1.0)
            outcome = self._done.result()
        finally:
            self.stream.close()  # frees the engine stream however this ends (a client that left cancels us)
        if outcome.error is not None:
            raise HttpError(500, "processing_error", f"the engine failed this file: {outcome.error}")
        if outcome.truncated:  # never a partial transcript passed off as the file's
            raise HttpError(413, "audio_too_long", f"the file is longer than the server's maximum session length "
                            f"(--max-session-seconds): the engine stopped at {outcome.audio_end_ms / 1000:.1f} s")
        # as OpenAI's API and `realtime.transcribe` give it: without the space the first word's token begins with
        return TranscriptionResult(outcome.text.strip(), outcome.words, self._tokens, self.audio.size / SAMPLE_RATE,
                                   outcome.prompt_tokens, outcome.completion_tokens)

    async def _wait(self, stall_timeout_s: float, poll_s: float) -> None:
        """Wait up to `poll_s` for the outcome; HttpError when the engine has made no progress for the stall time."""
        try:
            await asyncio.wait_for(asyncio.shield(self._done), timeout=min(poll_s, stall_timeout_s))
        except TimeoutError:
            if time.monotonic() - self.stream.last_progress > stall_timeout_s:
                raise HttpError(500, "engine_stalled", f"the engine made no progress on this file for "
                                f"{stall_timeout_s:g} s") from None


def segments(result: TranscriptionResult) -> list[dict[str, Any]]:
    """verbose_json segments: the words cut at pauses (and at most 30 s / 400 characters each), with the ids of
    the tokens that began inside each. Only what the server knows is reported: no log-probabilities."""
    cues = subtitle_cues(result.words, max_chars=SEGMENT_MAX_CHARS, max_ms=SEGMENT_MAX_MS, gap_ms=SEGMENT_GAP_MS)
    out = []
    for i, (start, end, text) in enumerate(cues):
        nxt = cues[i + 1][0] if i + 1 < len(cues) else None
        toks = [t for t, ms in result.tokens if ms >= (start if i else -1) and (nxt is None or ms < nxt)]
        out.append({"id": i, "seek": 0, "start": start / 1000, "end": end / 1000, "text": text, "tokens": toks,
                    "temperature": 0.0})
    return out


def render(req: TranscriptionRequest, result: TranscriptionResult) -> tuple[bytes, str]:
    """(body, content type) of a finished transcription in the requested format."""
    usage = {"type": "duration", "seconds": round(result.duration_s, 3)}
    fmt = req.response_format
    if fmt == "text":
        return result.text.encode(), "text/plain; charset=utf-8"
    if fmt in ("srt", "vtt"):
        cues = subtitle_cues(result.words)
        body = format_srt(cues) if fmt == "srt" else format_vtt(cues)
        return body.encode(), ("application/x-subrip" if fmt == "srt" else "text/vtt") + "; charset=utf-8"
    if fmt == "json":
        return json.dumps({"text": result.text, "usage": usage}).encode(), "application/json"
    verbose: dict[str, Any] = {"task": "transcribe", "language": req.language or "unknown",
                               "duration": round(result.duration_s, 3), "text": result.text}
    if not req.granularities or "segment" in req.granularities:  # OpenAI's default granularity is segment
        verbose["segments"] = segments(result)
    if "word" in req.granularities:
        verbose["words"] = [{"word": w.word, "start": w.start_ms / 1000, "end": w.end_ms / 1000} for w in result.words]
    verbose["usage"] = usage
    return json.dumps(verbose).encode(), "application/json"


class TrimmedDeltas:
    """Token texts as deltas whose concatenation is the stripped transcript: whitespace before the first word is
    dropped, and whitespace is held back until a word follows it (so none trails the last word)."""

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def push(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        body = text.rstrip()
        if not body:
            self._held += text
            return ""
        out, self._held = self._held + body, text[len(body):]
        return out


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"


async def serve_transcription(content_type: str | None, body: bytes, reply: HttpReply, *,
                              served: tuple[str, ...], stall_timeout_s: float, open_stream: OpenStream,
                              max_seconds: float | None = None) -> float:
    """Answer one upload on `reply`; returns the seconds of audio transcribed. HttpError / ProtocolError /
    AdmissionError before the reply started mean nothing was sent; after a streamed reply started, the caller
    reports them in the stream (`HttpReply.fail`)."""
    req = parse_request(parse_form(content_type, body), served)
    name = req.file.filename or "file"
    cancelled = threading.Event()
    decoding = asyncio.ensure_future(asyncio.to_thread(decode_audio_bytes, req.file.data, SAMPLE_RATE, name=name,
                                                       max_seconds=max_seconds, cancelled=cancelled))
    try:
        audio = await asyncio.shield(decoding)
    except asyncio.CancelledError:
        # the client left: a thread cannot be interrupted, so the decoding is told to stop at its next block, and
        # this upload keeps its place under --max-uploads until it has (abandoned uploads once piled up there)
        cancelled.set()
        await asyncio.wait({decoding})
        if not decoding.cancelled():
            decoding.exception()  # retrieved: it is the cancellation's, not news
        raise
    except AudioTooLong as exc:
        raise HttpError(413, "audio_too_long", f"{exc} (--max-upload-minutes)") from None
    except AudioError as exc:
        raise _bad(str(exc), "file", "invalid_audio") from None
    if not req.stream:
        job = TranscriptionJob(open_stream, req.delay_ms, audio)
        result = await job.run(stall_timeout_s)
        payload, ctype = render(req, result)
        reply.send(200, payload, ctype)
        return result.duration_s
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    job = TranscriptionJob(open_stream, req.delay_ms, audio, on_text=queue.put_nowait)
    reply.start(200, EVENT_STREAM, {"X-Accel-Buffering": "no"})
    runner = asyncio.create_task(job.run(stall_timeout_s))
    runner.add_done_callback(lambda _: queue.put_nowait(None))
    trim = TrimmedDeltas()
    try:
        finished = False
        while not finished:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            finished = batch[-1] is None
            # every text delivered so far, one event per token, in order, in one write
            deltas = [trim.push(t) for t in batch if t is not None]
            reply.write(b"".join(sse({"type": "transcript.text.delta", "delta": d}) for d in deltas if d))
        result = runner.result()
    finally:
        if not runner.done():
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
    usage = {"type": "tokens", "input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens,
             "total_tokens": result.prompt_tokens + result.completion_tokens}
    # our extensions, as on the websocket sessions' final events: the file's duration and every word's timing
    done = {"type": "transcript.text.done", "text": result.text, "usage": usage,
            "duration": round(result.duration_s, 3), "words": [w.to_json() for w in result.words]}
    reply.write(sse(done) + b"data: [DONE]\n\n")
    return result.duration_s


def protocol_error_status(err: ProtocolError) -> int:
    return 404 if err.code == "model_not_found" else 400

