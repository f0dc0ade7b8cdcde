"""OpenAI Realtime transcription dialect (GA event set), on the same `/v1/realtime` path.

Session: `session.update{session: {type: "transcription", audio: {input: {format, transcription,
turn_detection, noise_reduction}}, include}}`. Formats: `audio/pcm` at 24 kHz (default) or 16 kHz,
`audio/pcmu` and `audio/pcma` (G.711, 8 kHz); everything is resampled to the model's 16 kHz.
`transcription.model` must name a served model; `transcription.language` and `prompt` are echoed
but the model transcribes any language it hears (it has no prompt input). `noise_reduction` is
echoed and not applied. A bad update is rejected whole (error event) and changes nothing.

Turns: with `turn_detection: {type: "server_vad", ...}` (the default) Silero VAD cuts turns (see
`vad.py`): `speech_started` opens an item and its engine stream, `speech_stopped` ends it; with
`turn_detection: null` the client ends each turn with `input_audio_buffer.commit`. After a turn
ends: `input_audio_buffer.committed`, `conversation.item.added`, the rest of the deltas,
`conversation.item.input_audio_transcription.completed`, then `conversation.item.done` (with the
transcript). Each item is transcribed as its own engine stream.

Lower latency than OpenAI: the engine decodes a turn while it is spoken, so transcription deltas
for an item stream out *before* its `committed` event (its id is the one `speech_started` announced;
with manual commits the id appears first on these deltas). Only deltas with text are sent.

Extras (OpenAI's SDK ignores unknown fields): deltas carry `is_final: false`, `audio_end_ms` and the
`words` they completed; `completed` carries `is_final: true`, `audio_start_ms`, `audio_end_ms` and
all `words`. Times are ms of session audio (the clock of `speech_started.audio_start_ms`).
`audio.input.transcription.transcription_delay_ms` (or OpenAI's `delay` names, see `options.py`)
sets the model delay for later items.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from realtime.audio import AudioError, StreamingResampler
from realtime.config import ConfigError
from realtime.serving import AdmissionError, StreamError

from .codecs import PCM16_24K, AudioFormat, decode_base64, parse_openai_format
from .engine_stream import SAMPLE_RATE, EngineStream, StreamOutcome, TokenUpdate
from .events import ProtocolError, new_id, session_too_long, unsendable
from .options import parse_delay_ms, parse_delay_name
from .vad import SpeechAudio, SpeechStarted, SpeechStopped, TurnDetector, VadParams

if TYPE_CHECKING:
    from .connection import Connection

logger = logging.getLogger(__name__)

SERVER_ERROR_CODES = frozenset({"processing_error", "server_busy", "engine_stalled", "server_full",
                                "server_shutting_down"})
P_INPUT = "session.audio.input"
NOISE_REDUCTION_TYPES = ("near_field", "far_field")  # OpenAI's values; echoed, never applied (the docstring)
MAX_STREAMS = 2


@dataclass(frozen=True)
class TranscriptionConfig:
    model: str
    format: AudioFormat = PCM16_24K
    language: str | None = None
    prompt: str = ""
    delay_ms: int | None = None  # None: the model's default
    turn_detection: VadParams | None = field(default_factory=VadParams)
    noise_reduction: dict[str, Any] | None = None
    include: list[str] | None = None


@dataclass
class Item:
    id: str
    stream: EngineStream
    start_sample: int
    committed: bool = False
    previous_item_id: str | None = None
    ended_by_model: bool = False  # committed at the model's end token, not by the client or the VAD


def _ms(samples: int) -> int:
    return samples * 1000 // SAMPLE_RATE


class OpenAIDialect:
    name = "openai"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.session_id = conn.session_id
        self.config = TranscriptionConfig(model=conn.ctx.served_model_names[0])
        self.session_samples = 0  # 16 kHz samples of session audio so far (the clock of all *_ms fields)
        self._resampler = self._new_resampler()
        td = self.config.turn_detection
        self._detector: TurnDetector | None = None if td is None else TurnDetector(td)
        self.current: Item | None = None  # the turn being spoken (not committed yet)
        self.items: dict[str, Item] = {}  # items whose engine stream is open
        self.last_item_id: str | None = None

    # -- shapes ------------------------------------------------------------------------------------
    @staticmethod
    def new_event_id() -> str:
        return new_id("event_")

    @staticmethod
    def session_object(session_id: str, cfg: TranscriptionConfig, default_delay_ms: int) -> dict[str, Any]:
        td = cfg.turn_detection
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": session_id,
            "audio": {"input": {
                "format": cfg.format.to_json(),
                "transcription": {"model": cfg.model, "language": cfg.language, "prompt": cfg.prompt,
                                  "transcription_delay_ms": cfg.delay_ms or default_delay_ms},
                "turn_detection": None if td is None else {
                    "type": "server_vad", "threshold": td.threshold, "prefix_padding_ms": td.prefix_padding_ms,
                    "silence_duration_ms": td.silence_duration_ms},
                "noise_reduction": cfg.noise_reduction,
            }},
            "include": cfg.include,
        }

    @classmethod
    def default_session(cls, conn: Connection) -> dict[str, Any]:
        return cls.session_object(conn.session_id, TranscriptionConfig(model=conn.ctx.served_model_names[0]),
                                  conn.engine.config.streaming.default_delay_ms)

    def _session(self) -> dict[str, Any]:
        return self.session_object(self.session_id, self.config, self.conn.engine.config.streaming.default_delay_ms)

    def _send(self, event: dict[str, Any], arrival: float | None = None) -> None:
        self.conn.send({"type": event.pop("type"), "event_id": self.new_event_id(), **event}, arrival=arrival)

    # -- Dialect protocol ---------------------------------------------------------------------------
    def session_created(self) -> dict[str, Any]:
        return {"type": "session.created", "event_id": self.new_event_id(), "session": self._session()}

    @staticmethod
    def error_event(err: ProtocolError, client_event_id: str | None) -> dict[str, Any]:
        message = err.message if not err.detail else f"{err.message} ({err.detail})"
        return {"type": "error", "event_id": OpenAIDialect.new_event_id(), "error": {
            "type": "server_error" if err.code in SERVER_ERROR_CODES else "invalid_request_error",
            "code": err.code, "message": message, "param": err.param, "event_id": client_event_id}}

    def streams(self) -> Iterable[EngineStream]:
        return [it.stream for it in self.items.values()]

    def backlogged(self) -> bool:
        # at most MAX_STREAMS engine streams per session (the turn being spoken and the one before,
        # still flushing); the engine is sized for that (2 x --max-sessions)
        return len(self.items) >= MAX_STREAMS

    def close(self) -> None:
        for it in list(self.items.values()):
            it.stream.close()
        self.items.clear()
        self.current = None

    async def end_input(self) -> None:
        if self.current is None and self._detector is not None:
            return  # server VAD and no turn being spoken: the audio since the last turn was not speech
        try:
            await self._commit()  # as the client's input_audio_buffer.commit: committed, item added, completed
        except ProtocolError as err:
            if err.code != "input_audio_buffer_commit_empty":
                raise

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "session.update":
            await self._session_update(event)
        elif kind == "input_audio_buffer.append":
            await self._append(event)
        elif kind == "input_audio_buffer.commit":
            await self._commit()
        elif kind == "input_audio_buffer.clear":
            self._clear()
        elif isinstance(kind, str):
            raise ProtocolError("unknown_event", f"Unknown event type: {kind} (a transcription session accepts "
                                "session.update and input_audio_buffer.append/commit/clear)", param="type")
        else:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: type", param="type")

    # -- session.update ----------------------------------------------------------------------------
    async def _session_update(self, event: dict[str, Any]) -> None:
        new = self._parse_session(event.get("session"))
        old, self.config = self.config, new
        if new.format != old.format:
            # audio still inside the old resampler belongs before the change
            tail = self._resampler.flush() if old.format.rate != SAMPLE_RATE else np.zeros(0, np.float32)
            self._resampler = self._new_resampler()
            await self._ingest(tail, time.monotonic())
        if new.turn_detection != old.turn_detection:
            self._change_turn_detection()
        self._send({"type": "session.updated", "session": self._session()})

    def start_from(self, session: dict[str, Any]) -> None:
        """Start with a client secret's session configuration (before `session.created`)."""
        self.config = self._parse_session(session)
        self._resampler = self._new_resampler()
        td = self.config.turn_detection
        self._detector = None if td is None else TurnDetector(td)

    def _parse_session(self, session: object) -> TranscriptionConfig:
        return parse_session(self.config, session, self.conn.ctx.served_model_names)

    def _change_turn_detection(self) -> None:
        old = self._detector
        rest = old.take_pending() if old is not None else np.zeros(0, np.float32)  # < one VAD window
        rest_start = self.session_samples - rest.size
        td = self.config.turn_detection
        if td is None:
            self._detector = None
            if rest.size:  # manual turns: it belongs to the buffer like any audio since the last commit
                if self.current is None:
                    self._open_item(rest_start)
                self._push(self.current, rest, time.monotonic())
        else:
            # an open item stays the current turn; the new detector ends it at the next silence
            self._detector = TurnDetector(td, start_sample=rest_start, in_speech=self.current is not None,
                                          pending=rest)

    def _new_resampler(self) -> StreamingResampler:
        return StreamingResampler(self.config.format.rate, SAMPLE_RATE)

    # -- audio -----------------------------------------------------------------------------------
    async def _append(self, event: dict[str, Any]) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise ProtocolError("missing_required_parameter", "input_audio_buffer.append needs `audio`: base64 "
                                f"{self.config.format.type} audio", param="audio")
        try:
            samples = self.config.format.decode(decode_base64(audio))
        except AudioError as exc:
            raise ProtocolError("invalid_audio", f"Invalid audio data: {exc}", param="audio") from None
        if samples.size == 0:
            raise ProtocolError("invalid_audio", "Invalid audio data: the append holds no samples", param="audio")
        self.conn.count_audio(samples.size / self.config.format.rate)
        arrival = time.monotonic()
        if samples.size > self.config.format.rate and not self._resampler.identity:
            # over a second of audio (a 1 MiB G.711 append holds 98 s): resampled on a worker thread, as the VAD
            # is, so that the other sessions' events go on meanwhile; this session's next event waits for it
            x = await self.conn.loop.run_in_executor(self.conn.ctx.vad_executor, self._resampler.push, samples)
        else:
            x = self._resampler.push(samples)
        client_event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        await self._ingest(x, arrival, client_event_id)

    async def _ingest(self, x: np.ndarray, arrival: float, client_event_id: str | None = None) -> None:
        """New 16 kHz session audio: into the current item (manual turns) or through the VAD. One append can
        hold several VAD turns: each waits for room under the session's stream quota (MAX_STREAMS), and a turn
        the engine refuses is reported on its own while the turns after it go on."""
        start = self.session_samples
        self.session_samples += x.size
        if x.size == 0:
            return
        if self._detector is None:
            if self.current is None:
                self._open_item(start)
            self._push(self.current, x, arrival)
            return
        # The VAD runs on a worker thread; this session's next event waits for it (the receive loop
        # awaits `handle`), so the detector cannot change meanwhile.
        events = await self.conn.loop.run_in_executor(self.conn.ctx.vad_executor, self._detector.feed, x)
        refused = False  # this append's current turn could not open: its further audio is part of that error
        for ev in events:
            try:
                if isinstance(ev, SpeechStarted) or (isinstance(ev, SpeechAudio) and self.current is None
                                                     and not refused):
                    # a SpeechAudio with no item: the model ended the turn (end token) or it failed while speech
                    # goes on, so the rest of the speech is a new turn
                    await self.conn.wait_for_stream_room()
                    item = self._open_item(ev.start_sample)
                    refused = False
                    self._speech_event("started", item, ev.start_sample)
                if isinstance(ev, (SpeechStarted, SpeechAudio)) and self.current is not None:
                    self._push(self.current, ev.audio, arrival)
                elif isinstance(ev, SpeechStopped):
                    refused = False
                    if self.current is not None:
                        item = self.current
                        self._speech_event("stopped", item, ev.end_sample)
                        self._commit_item(item)
            except ProtocolError as err:  # this turn's error; the append's later turns still go on
                refused = self.current is None
                self.conn.send_error(err, client_event_id)

    def _speech_event(self, kind: str, item: Item, sample: int) -> None:
        """`input_audio_buffer.speech_started` (its `audio_start_ms`) or `.speech_stopped` (`audio_end_ms`)."""
        edge = "audio_start_ms" if kind == "started" else "audio_end_ms"
        self._send({"type": f"input_audio_buffer.speech_{kind}", edge: _ms(sample), "item_id": item.id})

    def _push(self, item: Item, x: np.ndarray, arrival: float) -> None:
        try:
            item.stream.push(x, arrival)
        except (StreamError, AudioError) as exc:
            raise ProtocolError("invalid_audio", f"Invalid audio data: {exc}", param="audio") from None

    def _open_item(self, start_sample: int, *, current: bool = True) -> Item:
        item_id = new_id("item_")
        try:
            stream = EngineStream(self.conn.engine, self.conn.engine_events, delay_ms=self.config.delay_ms,
                                  offset_ms=_ms(start_sample), on_token=partial(self._on_token, item_id),
                                  on_end=partial(self._on_end, item_id))
        except AdmissionError as exc:
            raise ProtocolError("server_busy", "The engine is at capacity; this audio was not transcribed",
                                detail=exc.reason) from None
        except ConfigError as exc:
            raise ProtocolError("invalid_value", str(exc)) from None
        item = Item(item_id, stream, start_sample)
        self.conn.usage.turns += 1
        self.items[item_id] = item
        if current:
            self.current = item
        return item

    async def _commit(self) -> None:
        if self._detector is None:
            # manual turns: the resampler's last few samples belong to this item
            await self._ingest(self._resampler.flush(), time.monotonic())
            self._resampler = self._new_resampler()
        else:
            # VAD turns: cut at the audio classified so far; samples short of a window join the turn
            rest = self._detector.take_pending()
            if self.current is not None and rest.size:
                self._push(self.current, rest, time.monotonic())
            self._detector.end_turn()
        item = self.current
        if item is None or item.stream.samples == 0:
            raise ProtocolError("input_audio_buffer_commit_empty",
                                "Error committing input audio buffer: the buffer holds no audio")
        self._commit_item(item)

    def _commit_item(self, item: Item) -> None:
        item.stream.finish()  # a no-op when the engine already ended the stream
        item.committed = True
        if self.current is item:
            self.current = None
        item.previous_item_id, self.last_item_id = self.last_item_id, item.id
        self._send({"type": "input_audio_buffer.committed", "previous_item_id": item.previous_item_id,
                    "item_id": item.id})
        self._send({"type": "conversation.item.added", "previous_item_id": item.previous_item_id,
                    "item": self._item_json(item, None)})

    def _clear(self) -> None:
        self._resampler = self._new_resampler()  # its buffered samples are part of what is cleared
        if self.current is not None:
            self.current.stream.close()
            self.items.pop(self.current.id, None)
            self.current = None
        if self._detector is not None:
            self._detector.take_pending()
            self._detector = TurnDetector(self._detector.params, start_sample=self.session_samples)
        self._send({"type": "input_audio_buffer.cleared"})

    @staticmethod
    def _item_json(item: Item, transcript: str | None) -> dict[str, Any]:
        return {"id": item.id, "type": "message", "object": "realtime.item", "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": transcript}]}

    # -- engine output ---------------------------------------------------------------------------
    def _on_token(self, item_id: str, up: TokenUpdate) -> None:
        self.conn.count_token()
        item = self.items.get(item_id)
        if item is not None and item is self.current and item.stream.eos_seen:
            # The model says the speech ended: end the turn here; later audio starts a new one. (The
            # VAD may be running on a worker thread now, so it is not touched: `_ingest` opens the
            # next turn when speech audio comes with no current item.)
            item.ended_by_model = True
            self._commit_item(item)
        if not up.text:
            return
        self._send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item_id,
                    "content_index": 0, "delta": up.text, "is_final": False, "audio_end_ms": up.audio_end_ms,
                    "words": [w.to_json() for w in up.words]}, arrival=up.arrival)

    def _on_end(self, item_id: str, out: StreamOutcome) -> None:
        item = self.items.pop(item_id, None)
        if item is None:
            return
        was_current = self.current is item
        if was_current:  # ended before its turn did: later audio starts a new item
            self.current = None
            if out.error is None:
                self._commit_item(item)  # an engine that ends a stream at its end token: commit it now
        self.conn.touch()
        if out.error is not None:
            self.conn.count_error("processing_error")
            self._send({"type": "conversation.item.input_audio_transcription.failed", "item_id": item_id,
                        "content_index": 0, "error": {"type": "server_error", "code": "processing_error",
                                                      "message": f"Transcription failed: {out.error}",
                                                      "param": None}})
            return
        if out.truncated:  # before the final event: clients that stop reading there still see it
            self.conn.send_error(session_too_long(out.audio_end_ms, "The audio after that point starts a new item."))
        self._send({
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": item_id,
            "content_index": 0,
            "transcript": out.text,
            "usage": {"type": "tokens", "input_tokens": out.prompt_tokens, "output_tokens": out.completion_tokens,
                      "total_tokens": out.prompt_tokens + out.completion_tokens},
            "logprobs": None,
            **out.final_fields(),
        })
        self._send({"type": "conversation.item.done", "previous_item_id": item.previous_item_id,
                    "item": self._item_json(item, out.text)})
        if out.rest.size:
            # the turn goes on in the next item unless the client (or the VAD) had ended it, or a later item runs
            self._continue_turn(item, out, self.current is None and (was_current or item.ended_by_model))

    def _continue_turn(self, ended: Item, out: StreamOutcome, goes_on: bool) -> None:
        """The audio an item's stream was sent after its transcript ended (the model's end token, or the maximum
        length) is transcribed in a new item: the current one, which later audio joins, if its turn `goes_on`;
        else an item of its own, committed at once."""
        start = ended.start_sample + ended.stream.samples - out.rest.size
        try:
            item = self._open_item(start, current=goes_on)
        except ProtocolError as err:  # the engine is full: this audio is not transcribed, and the error says so
            self.conn.send_error(err)
            return
        if self._detector is not None:
            self._speech_event("started", item, start)
        try:
            self._push(item, out.rest, out.rest_arrival)
        except ProtocolError as err:
            self.conn.send_error(err)
        if not goes_on:
            if self._detector is not None:
                self._speech_event("stopped", item, start + out.rest.size)
            self._commit_item(item)


def parse_session(cfg: TranscriptionConfig, session: object, names: tuple[str, ...]) -> TranscriptionConfig:
    """`cfg` updated by a `session.update`'s (or a client secret's) `session` object; ProtocolError names the field
    at fault. `names`: the served model names."""
    if not isinstance(session, dict):
        raise ProtocolError("missing_required_parameter", "session.update needs a `session` object",
                            param="session")
    stype = session.get("type", "transcription")
    if stype != "transcription":
        raise ProtocolError("invalid_value", f"Only transcription sessions are served here, got type {stype!r}",
                            param="session.type")
    inc = session.get("include", cfg.include)
    if inc is not None and (not isinstance(inc, list) or not all(isinstance(x, str) for x in inc)):
        raise ProtocolError("invalid_value", "include must be a list of strings", param="session.include")
    cfg = replace(cfg, include=inc)
    audio = session.get("audio", {})
    if audio is None:
        audio = {}
    if not isinstance(audio, dict) or not isinstance(audio.get("input", {}), (dict, type(None))):
        raise ProtocolError("invalid_value", "audio must be an object like {\"input\": {...}}",
                            param="session.audio")
    inp = audio.get("input") or {}
    if "format" in inp:
        try:
            cfg = replace(cfg, format=parse_openai_format(inp["format"]))
        except ValueError as exc:
            raise ProtocolError("invalid_value", str(exc), param=f"{P_INPUT}.format") from None
    if "transcription" in inp and inp["transcription"] is not None:
        cfg = _parse_transcription(cfg, inp["transcription"], names)
    if "turn_detection" in inp:
        cfg = replace(cfg, turn_detection=_parse_turn_detection(inp["turn_detection"]))
    if "noise_reduction" in inp:
        nr = inp["noise_reduction"]
        if nr is not None and (not isinstance(nr, dict) or set(nr) - {"type"}
                               or nr.get("type") not in NOISE_REDUCTION_TYPES):
            raise ProtocolError("invalid_value", "noise_reduction must be null or {\"type\": \"near_field\" or "
                                "\"far_field\"}", param=f"{P_INPUT}.noise_reduction")
        cfg = replace(cfg, noise_reduction=nr)
    # what `session.updated` will echo must be sendable, or the update is rejected whole (fields are checked above;
    # this is the guard for any value a check lets through)
    why = unsendable(OpenAIDialect.session_object("sess_", cfg, 0))
    if why is not None:
        raise ProtocolError("invalid_value", f"The session cannot be echoed back: {why}", param="session")
    return cfg


def _parse_transcription(cfg: TranscriptionConfig, tr: object, names: tuple[str, ...]) -> TranscriptionConfig:
    param = f"{P_INPUT}.transcription"
    if not isinstance(tr, dict):
        raise ProtocolError("invalid_value", "transcription must be an object", param=param)
    model = tr.get("model", cfg.model)
    if not isinstance(model, str) or (model and model not in names):
        raise ProtocolError("model_not_found", f"The model `{model}` does not exist (served: {', '.join(names)})",
                            param=f"{param}.model")
    language = tr.get("language", cfg.language)
    if language is not None and not isinstance(language, str):
        raise ProtocolError("invalid_value", "language must be a string", param=f"{param}.language")
    prompt = tr.get("prompt", cfg.prompt)
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise ProtocolError("invalid_value", "prompt must be a string", param=f"{param}.prompt")
    delay = cfg.delay_ms
    if tr.get("delay") is not None:
        delay = parse_delay_name(tr["delay"], f"{param}.delay")
    if tr.get("transcription_delay_ms") is not None:  # the explicit value wins over a delay name
        delay = parse_delay_ms(tr["transcription_delay_ms"], f"{param}.transcription_delay_ms")
    return replace(cfg, model=model or names[0], language=language, prompt=prompt, delay_ms=delay)


def _parse_turn_detection(td: object) -> VadParams | None:
    param = f"{P_INPUT}.turn_detection"
    if td is None:
        return None
    if not isinstance(td, dict):
        raise ProtocolError("invalid_value", "turn_detection must be an object or null", param=param)
    if td.get("type") != "server_vad":
        raise ProtocolError("invalid_value", f"turn_detection type {td.get('type')!r} is not supported "
                            "(use \"server_vad\", or null for manual commits)", param=f"{param}.type")
    d = VadParams()
    threshold = td.get("threshold", d.threshold)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ProtocolError("invalid_value", f"threshold must be a number in [0, 1], got {threshold!r}",
                            param=f"{param}.threshold")
    values = {}
    for name, hi in (("prefix_padding_ms", 10_000), ("silence_duration_ms", 10_000)):
        v = td.get(name, getattr(d, name))
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise ProtocolError("invalid_value", f"{name} must be an integer in [0, {hi}], got {v!r}",
                                param=f"{param}.{name}")
        values[name] = v
    return VadParams(float(threshold), **values)
