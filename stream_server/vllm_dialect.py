"""vLLM's `/v1/realtime` dialect (shared/reference/vllm_realtime_protocol.md), written from its description.

Wire format, field order, error codes and messages are vLLM's. Where vLLM is silent or drops
something, we say so explicitly instead (each with its own error code; the session goes on):

* `session.update` is answered with `session.updated` (vLLM's own test waits for it optionally).
* A non-final commit while an utterance runs -> `utterance_in_progress` (vLLM ignores it).
* A final commit with no utterance -> `no_active_utterance`; buffered audio is kept for the next
  utterance (vLLM instead queues an end marker that ends the next utterance at once).
* Audio appended after the final commit, before `transcription.done` -> `audio_after_final`, and
  that audio is not used (vLLM discards it silently). Audio appended after `done` and before the next
  commit is kept for that utterance (as in vLLM).
* Audio waiting for a commit is bounded (`max_buffered_audio_s`) -> `buffer_full` past it.
* Binary frames -> `invalid_event` (vLLM closes the socket).
* An utterance the engine ends early (the model's end token, or the maximum session length) -> an
  error first (`utterance_ended` or `session_too_long`), then `transcription.done`, whose `audio_end_ms`
  is where its transcript ends. The audio sent after that point is kept, with audio appended from now
  on, for the next utterance (the next commit), as audio appended after `done` always is.
* Where vLLM's message is fixed ("Invalid audio data"), the reason is in an extra `detail` field.

Extras (ignored by vLLM's clients, which read only the fields they know): each
`transcription.delta` carries `is_final: false`, `audio_end_ms` (audio of this utterance the model
had seen when it emitted the token, for measuring emission delay) and `words` (words this token
completed, with `start_ms`/`end_ms`); `transcription.done` carries `is_final: true`,
`audio_start_ms`/`audio_end_ms` and all `words` (above 4096 words only those no delta carried, with
`words_truncated: true`). Times are ms from the utterance's first sample
(conventions in `realtime/timestamps.py`). `session.update` also takes `transcription_delay_ms`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from realtime.audio import AudioError, pcm16_to_float
from realtime.config import ConfigError
from realtime.serving import AdmissionError, StreamError

from .codecs import decode_base64
from .engine_stream import SAMPLE_RATE, EngineStream, StreamOutcome, TokenUpdate
from .events import ProtocolError, session_too_long
from .options import parse_delay_ms

if TYPE_CHECKING:
    from .connection import Connection

logger = logging.getLogger(__name__)

MODEL_NOT_VALIDATED = "Model not validated. Make sure to validate the model by sending a session.update event."


class VllmDialect:
    name = "vllm"
    AUDIO_AFTER_THE_END = ("The audio sent after that point is kept, with audio appended from now on, for the next "
                           "utterance: send input_audio_buffer.commit to start it (a final commit now gets "
                           "no_active_utterance once transcription.done has come)")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.validated = False
        self.model: str | None = None
        self.delay_ms: int | None = None
        self.utterance: EngineStream | None = None
        self._buffer: list[tuple[np.ndarray, float]] = []  # (16 kHz samples, arrival) awaiting a commit
        self._buffer_samples = 0
        self._eos_reported = False

    # -- Dialect protocol ---------------------------------------------------------------------
    def session_created(self) -> dict[str, Any]:
        from .openai_dialect import OpenAIDialect

        # vLLM's fields first; the OpenAI fields after them let an OpenAI client that did not say
        # `?intent=transcription` read the same event (each side ignores the other's fields).
        return {"type": "session.created", "id": self.conn.session_id, "created": self.conn.created,
                "event_id": OpenAIDialect.new_event_id(), "session": OpenAIDialect.default_session(self.conn)}

    @staticmethod
    def error_event(err: ProtocolError, client_event_id: str | None) -> dict[str, Any]:
        event: dict[str, Any] = {"type": "error", "error": err.message, "code": err.code}
        if err.detail:
            event["detail"] = err.detail
        return event

    def streams(self) -> Iterable[EngineStream]:
        return () if self.utterance is None else (self.utterance,)

    def backlogged(self) -> bool:
        return False  # one utterance at a time: its audio backlog is the only limit

    def close(self) -> None:
        if self.utterance is not None:
            self.utterance.close()
            self.utterance = None
        self._buffer.clear()

    async def end_input(self) -> None:
        # audio appended since the last utterance and waiting for a commit is transcribed too (nothing the client
        # sent is dropped); a session that never validated a model has no utterance to start
        if self.utterance is None and self._buffer and self.validated:
            self._start_utterance()
        u = self.utterance
        if u is not None and not u.finished:
            u.finish()

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "session.update":
            self._session_update(event)
        elif kind == "input_audio_buffer.append":
            self._append(event)
        elif kind == "input_audio_buffer.commit":
            self._commit(event)
        else:
            raise ProtocolError("unknown_event", f"Unknown event type: {kind}")

    # -- events ----------------------------------------------------------------------------------
    def _session_update(self, event: dict[str, Any]) -> None:
        model = event.get("model")
        if model is None:
            raise ProtocolError("invalid_event", "Missing required field: model")
        if not isinstance(model, str):
            raise ProtocolError("processing_error", f"model must be a string, got {type(model).__name__}")
        names = self.conn.ctx.served_model_names
        if model and model not in names:
            raise ProtocolError("model_not_found", f"The model `{model}` does not exist.",
                                detail=f"served models: {', '.join(names)}")
        delay = self.delay_ms
        if event.get("transcription_delay_ms") is not None:
            delay = parse_delay_ms(event["transcription_delay_ms"], "transcription_delay_ms")
        # applied only once everything validated: a bad update changes nothing
        self.validated, self.model, self.delay_ms = True, model or names[0], delay
        self.conn.send({"type": "session.updated", "id": self.conn.session_id, "model": self.model,
                        "transcription_delay_ms": self._effective_delay()})

    def _effective_delay(self) -> int:
        return self.delay_ms if self.delay_ms is not None else self.conn.engine.config.streaming.default_delay_ms

    def _append(self, event: dict[str, Any]) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise ProtocolError("processing_error", "input_audio_buffer.append needs `audio`: a base64 string of "
                                "PCM16 little-endian mono 16 kHz samples")
        try:
            samples = pcm16_to_float(decode_base64(audio))
        except AudioError as exc:
            raise ProtocolError("invalid_audio", "Invalid audio data", detail=str(exc)) from None
        if samples.size == 0:
            raise ProtocolError("invalid_audio", "Invalid audio data", detail="the append holds no samples")
        now = time.monotonic()
        self.conn.count_audio(samples.size / SAMPLE_RATE)
        u = self.utterance
        if u is not None and not u.finished and u.eos_seen:
            # the model ended this utterance: later audio waits for the next one, as after its `done`
            self._buffer_append(samples, now)
            if not self._eos_reported:
                self._eos_reported = True
                raise ProtocolError("utterance_ended", f"The model ended this utterance (end-of-speech token). "
                                    f"{self.AUDIO_AFTER_THE_END}")
            return  # reported once per utterance
        if u is not None and not u.finished:
            try:
                u.push(samples, now)
            except (StreamError, AudioError) as exc:
                raise ProtocolError("invalid_audio", "Invalid audio data", detail=str(exc)) from None
            return
        if u is not None:
            raise ProtocolError(
                "audio_after_final", "Audio appended after the final commit is not part of the finishing utterance "
                "and was discarded; wait for transcription.done, then commit to start a new utterance")
        self._buffer_append(samples, now)

    def _buffer_append(self, samples: np.ndarray, arrival: float) -> None:
        limit = int(self.conn.settings.max_buffered_audio_s * SAMPLE_RATE)
        if self._buffer_samples + samples.size > limit:
            raise ProtocolError(
                "buffer_full", f"More than {self.conn.settings.max_buffered_audio_s:g} s of audio is waiting for a "
                "commit; this append was not buffered. Send input_audio_buffer.commit to start an utterance")
        self._buffer.append((samples, arrival))
        self._buffer_samples += samples.size

    def _commit(self, event: dict[str, Any]) -> None:
        final = event.get("final", False)
        if not isinstance(final, bool):
            raise ProtocolError("processing_error", f"`final` must be a boolean, got {final!r}")
        if not self.validated:
            raise ProtocolError("model_not_validated", MODEL_NOT_VALIDATED)
        if not final:
            self._start_utterance()
            return
        u = self.utterance
        if u is None:
            raise ProtocolError("no_active_utterance", "No utterance is running: send input_audio_buffer.commit "
                                "without `final` to start one (audio appended so far is kept for it)")
        if u.finished:
            raise ProtocolError("utterance_finishing", "The running utterance already got its final commit; "
                                "wait for transcription.done")
        u.finish()

    def _start_utterance(self) -> None:
        if self.utterance is not None:
            raise ProtocolError("utterance_in_progress", "An utterance is already running: end it with "
                                "input_audio_buffer.commit {\"final\": true} before starting another")
        try:
            u = EngineStream(self.conn.engine, self.conn.engine_events, delay_ms=self.delay_ms, offset_ms=0,
                             on_token=self._on_token, on_end=self._on_end)
        except AdmissionError as exc:
            raise ProtocolError("server_busy", "The engine is at capacity; try the commit again shortly",
                                detail=exc.reason) from None
        except ConfigError as exc:
            raise ProtocolError("invalid_value", str(exc)) from None
        self.utterance = u
        self.conn.usage.turns += 1
        self._eos_reported = False
        buffered, self._buffer, self._buffer_samples = self._buffer, [], 0
        for samples, arrival in buffered:
            u.push(samples, arrival)

    # -- engine output --------------------------------------------------------------------------
    def _on_token(self, up: TokenUpdate) -> None:
        self.conn.count_token()
        if not up.text and not self.conn.settings.vllm_empty_deltas:
            return  # --no-empty-deltas: the transcript is the same, and most tokens cost no event
        self.conn.send({"type": "transcription.delta", "delta": up.text, "is_final": False,
                        "audio_end_ms": up.audio_end_ms, "words": [w.to_json() for w in up.words]},
                       arrival=up.arrival)

    def _on_end(self, out: StreamOutcome) -> None:
        self.utterance = None
        self.conn.touch()
        if out.error is not None:
            self.conn.send_error(ProtocolError("processing_error", f"Transcription failed: {out.error}"))
            return
        if out.rest.size:  # first in line for the next utterance (audio buffered meanwhile came after it)
            self._buffer.insert(0, (out.rest, out.rest_arrival))
            self._buffer_samples += out.rest.size
        # errors before the final event: clients that stop reading there still see them
        if out.truncated:
            self.conn.send_error(session_too_long(out.audio_end_ms, self.AUDIO_AFTER_THE_END))
        elif out.rest.size and not self._eos_reported:
            self._eos_reported = True
            self.conn.send_error(ProtocolError(
                "utterance_ended", f"The model ended this utterance (end-of-speech token): its transcript ends at "
                f"{out.audio_end_ms} ms. {self.AUDIO_AFTER_THE_END}"))
        self.conn.send({
            "type": "transcription.done",
            "text": out.text,
            "usage": {"prompt_tokens": out.prompt_tokens, "total_tokens": out.prompt_tokens + out.completion_tokens,
                      "completion_tokens": out.completion_tokens, "prompt_tokens_details": None},
            **out.final_fields(),
        })
