"""One engine stream seen from the event loop: push audio, get timed token updates and an outcome.

Engine callbacks arrive on the engine thread; they are handed to the event loop through
`EngineEvents` (one queue per loop, drained by one scheduled callback) and dropped there if the
stream was closed meanwhile (the engine sends nothing after `close_stream`, but an event may already
be queued). The stream also remembers when
each piece of audio arrived, so that the emission delay of a token (send time minus the arrival of
the audio up to its `audio_end_ms`) can be measured when the token is sent.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from realtime.serving import StreamDone, StreamError, StreamEvent, StreamFailed, StreamToken, TranscriptionEngine
from realtime.timestamps import TokenClock, Word, WordTracker

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class TokenUpdate:
    token_id: int
    text: str
    audio_end_ms: int  # client time base: audio the model had seen, clamped to the audio received
    start_ms: int  # client time base: the audio frame this token transcribes
    end_ms: int
    words: list[Word]  # words this token completed
    arrival: float  # monotonic time the audio up to audio_end_ms arrived


MAX_FINAL_WORDS = 4096  # final events list every word only up to this many (see `final_words`)


@dataclass(frozen=True)
class StreamOutcome:
    text: str
    prompt_tokens: int
    completion_tokens: int
    words: list[Word]  # every word of the stream
    tail_words: list[Word]  # the words no delta carried (completed by the end of the stream)
    audio_start_ms: int
    audio_end_ms: int
    arrival: float
    error: str | None = None  # set when the engine failed the stream
    # the stream reached the engine's maximum session length (`--max-session-seconds`): the transcript covers the
    # audio up to `audio_end_ms` only (dialects say so)
    truncated: bool = False
    # audio sent to the stream after `audio_end_ms`, which its transcript does not cover: the stream ended early (the
    # model's end token, or the maximum length). Empty otherwise. Dialects hand it to the next item or utterance
    rest: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    rest_arrival: float = 0.0  # monotonic arrival of the rest's first sample
    ended_by_eos: bool = False

    def final_words(self) -> tuple[list[Word], bool]:
        """(words for the final event, truncated). Every word, unless there are more than
        MAX_FINAL_WORDS: then only the tail, since the deltas already carried the others (so that an
        hours-long segment does not end with a multi-megabyte event that clients refuse)."""
        if len(self.words) <= MAX_FINAL_WORDS:
            return self.words, False
        return self.tail_words, True

    def final_fields(self) -> dict[str, Any]:
        """Our extensions of both dialects' final event: markers, audio span, words."""
        words, truncated = self.final_words()
        fields: dict[str, Any] = {"is_final": True, "audio_start_ms": self.audio_start_ms,
                                  "audio_end_ms": self.audio_end_ms, "words": [w.to_json() for w in words]}
        if truncated:
            fields["words_truncated"] = True
        return fields


@dataclass
class _Undecided:
    """The samples sent after the transcript's decided end (the end of the frame its last token closed): what a
    stream that ends early leaves untranscribed. The model's look-ahead (its delay) and any backlog, so a few
    seconds at most; samples before the decided end are let go as tokens arrive."""

    chunks: deque = field(default_factory=deque)  # (first sample index, samples, arrival)
    decided: int = 0  # samples covered by the transcript

    def add(self, start: int, samples: np.ndarray, arrival: float) -> None:
        self.chunks.append((start, samples, arrival))

    def decide(self, sample: int) -> None:
        self.decided = max(self.decided, sample)
        while self.chunks and self.chunks[0][0] + self.chunks[0][1].size <= self.decided:
            self.chunks.popleft()

    def rest(self) -> tuple[np.ndarray, float]:
        """(the samples after the decided end, the arrival of the first of them)."""
        parts = [s[max(0, self.decided - start):] for start, s, _ in self.chunks]
        arrival = self.chunks[0][2] if self.chunks else 0.0
        return (np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)), arrival


@dataclass
class _Arrivals:
    """Cumulative sample counts and their arrival times (monotonic), for emission delays.

    Queries come in increasing sample order, so entries before the last answer are dropped now and
    then: an hours-long stream keeps only what its undecoded audio needs.
    """

    ends: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def add(self, end_sample: int, t: float) -> None:
        self.ends.append(end_sample)
        self.times.append(t)

    def time_of(self, sample: int, default: float) -> float:
        i = bisect.bisect_left(self.ends, sample)
        t = self.times[i] if i < len(self.times) else default
        if i > 256:
            del self.ends[:i], self.times[:i]
        return t


class EngineEvents:
    """Engine-thread events to the event loop, in order, a step's worth at a time.

    One `loop.call_soon_threadsafe` per event cost the engine thread ~5 us (a lock and a write to the
    loop's wake-up pipe), per token of every stream, between a step's device work and the next
    step's launch; with hundreds of streams that was milliseconds per step. Here the engine thread
    appends to a queue and wakes the loop only when no drain is pending; the drain delivers
    everything queued by the time it runs. A failing delivery is logged and never stops the others.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._queue: deque[tuple[Callable[[StreamEvent], None], StreamEvent]] = deque()
        self._scheduled = False

    def put(self, deliver: Callable[[StreamEvent], None], ev: StreamEvent) -> None:
        """Any thread: `deliver(ev)` runs on the loop after every event put before it."""
        with self._lock:
            self._queue.append((deliver, ev))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is gone (server shutting down): nothing will deliver these
            with self._lock:
                self._queue.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, deque()
            self._scheduled = False
        for deliver, ev in batch:
            try:
                deliver(ev)
            except Exception:  # one session's failure must not cost the others their events
                logger.exception("delivering an engine event failed")


class EngineStream:
    def __init__(self, engine: TranscriptionEngine, events: EngineEvents, *, delay_ms: int | None,
                 offset_ms: int, on_token: Callable[[TokenUpdate], None],
                 on_end: Callable[[StreamOutcome], None]) -> None:
        cfg = engine.config
        self.engine, self.events = engine, events
        self.offset_ms = offset_ms
        self.delay_ms = cfg.streaming.default_delay_ms if delay_ms is None else delay_ms
        self.clock = TokenClock(cfg.streaming.n_left_pad_tokens, cfg.delay_tokens(self.delay_ms),
                                cfg.token_duration_ms)
        self._on_token, self._on_end = on_token, on_end
        self.samples = 0
        self.finished = False  # finish requested
        self.ended = False  # outcome delivered (or closed)
        self.closed = False
        self.last_progress = time.monotonic()
        self._arrivals = _Arrivals()
        self._undecided = _Undecided()
        self._finish_time = 0.0
        self._words = WordTracker()
        self._seen_ms = 0  # audio_end_ms only moves forward (a flushed tail token may report less)
        self._eos = cfg.tokens.eos
        self.eos_seen = False  # the model emitted its end token: later audio of this stream is not decoded
        # raises AdmissionError / ConfigError; nothing to clean up if it does
        self.stream_id = engine.open_stream(self._from_engine_thread, delay_ms=self.delay_ms)

    # -- loop side --------------------------------------------------------------------------
    @property
    def audio_ms(self) -> int:
        return self.samples * 1000 // SAMPLE_RATE

    def push(self, samples: np.ndarray, arrival: float | None = None) -> None:
        if samples.size == 0:
            return
        self.engine.push_audio(self.stream_id, samples)
        arrival = time.monotonic() if arrival is None else arrival
        self._undecided.add(self.samples, samples, arrival)
        self.samples += samples.size
        self.last_progress = time.monotonic()  # the stall clock runs from the latest work handed over
        self._arrivals.add(self.samples, arrival)

    def finish(self) -> None:
        if self.finished or self.closed:
            self.finished = True
            return
        try:
            self.engine.finish_stream(self.stream_id)
        except StreamError:  # the engine already ended it (end token); its outcome is on the way
            logger.debug("finish_stream(%s): already ended", self.stream_id)
        self.finished = True
        self._finish_time = time.monotonic()
        self.last_progress = self._finish_time

    def close(self) -> None:
        """Abort (if still running) and free the engine's resources; idempotent."""
        if not self.closed:
            self.closed = True
            self.ended = True
            try:
                self.engine.close_stream(self.stream_id)
            except Exception:  # a broken engine must not stop the session's cleanup
                logger.exception("close_stream(%s) failed", self.stream_id)

    def pending_audio_seconds(self) -> float:
        if self.ended:
            return 0.0
        return self.engine.pending_audio_seconds(self.stream_id)

    @property
    def awaiting_engine(self) -> bool:
        """Work the engine owes us: undecoded audio or, after finish, the outcome."""
        return not self.ended and (self.finished or self.pending_audio_seconds() > 0)

    # -- engine thread -> loop ----------------------------------------------------------------
    def _from_engine_thread(self, ev: StreamEvent) -> None:
        self.events.put(self._deliver, ev)

    def _deliver(self, ev: StreamEvent) -> None:
        if self.closed or self.ended:
            return
        self.last_progress = time.monotonic()
        if isinstance(ev, StreamToken):
            self._on_token(self._token_update(ev))
        elif isinstance(ev, StreamDone):
            tail = self._words.flush()
            self.close()  # the engine keeps a finished stream until it is closed
            end_ms, rest, rest_arrival = self.audio_ms, np.zeros(0, np.float32), 0.0
            if ev.truncated or ev.ended_by_eos:
                # the transcript ends at the frame its last token closed (the model's look-ahead beyond it was
                # seen, not transcribed); what was sent after that goes back to the dialect
                rest, rest_arrival = self._undecided.rest()
                end_ms = min(self._undecided.decided, self.samples) * 1000 // SAMPLE_RATE
            self._on_end(StreamOutcome(ev.text, ev.prompt_tokens, ev.completion_tokens, self._words.words, tail,
                                       self.offset_ms, self.offset_ms + end_ms, self._finish_time,
                                       truncated=ev.truncated, rest=rest, rest_arrival=rest_arrival,
                                       ended_by_eos=ev.ended_by_eos))
        elif isinstance(ev, StreamFailed):
            self.close()
            self._on_end(StreamOutcome("", 0, 0, self._words.words, [], self.offset_ms,
                                       self.offset_ms + self.audio_ms, self._finish_time, error=ev.message))

    def _token_update(self, ev: StreamToken) -> TokenUpdate:
        if ev.token_id == self._eos:
            self.eos_seen = True
        total = self.audio_ms
        self._seen_ms = max(self._seen_ms, ev.audio_end_ms)
        seen = min(self._seen_ms, total)
        start, end = self.clock.frame_ms(ev.position)
        self._undecided.decide(max(end, 0) * SAMPLE_RATE // 1000)
        start, end = min(max(start, 0), total), min(max(end, 0), total)
        words = self._words.push(ev.text, self.offset_ms + start, self.offset_ms + end) if ev.text else []
        default = self._finish_time if self.finished else time.monotonic()
        arrival = self._arrivals.time_of(self._seen_ms * SAMPLE_RATE // 1000, default)
        return TokenUpdate(ev.token_id, ev.text, self.offset_ms + seen, self.offset_ms + start, self.offset_ms + end,
                           words, arrival)
