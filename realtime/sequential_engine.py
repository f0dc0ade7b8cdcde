"""A simple engine: one `StreamingSession` per stream, stepped round-robin on one engine thread.

Correct and easy to follow, but it decodes streams one after another. It is the CPU reference
behind the service interface (`serving.TranscriptionEngine`); the batched engine implements the same
interface for throughput.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .audio import as_mono_float32
from .model import VoxtralRealtime
from .serving import (
    AdmissionError,
    EngineStats,
    EventCallback,
    StreamDone,
    StreamError,
    StreamEvent,
    StreamFailed,
    StreamToken,
)
from .session import StreamingSession
from .tokenizer import TextTokenizer

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    session: StreamingSession
    on_event: EventCallback
    pending: deque = field(default_factory=deque)  # np.ndarray chunks not yet pushed
    pending_samples: int = 0
    finish_requested: bool = False
    closed: bool = False
    done: bool = False
    # held while an event is delivered; `close_stream` sets `closed` under it, so no event follows a close
    notify_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def notify(self, event: StreamEvent) -> None:
        with self.notify_lock:
            if not self.closed:
                self.on_event(event)


class SequentialEngine:
    def __init__(self, model: VoxtralRealtime, tokenizer: TextTokenizer, *, model_name: str = "default",
                 max_streams: int = 64, chunk_samples: int = 1280 * 4) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, model.config
        self.model_name = model_name
        self.max_streams = max_streams
        self._chunk = chunk_samples  # audio handed to a session per turn, so streams take turns
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._next_id = 1
        self._stop = False
        self._thread: threading.Thread | None = None
        self._stats = EngineStats(max_streams=max_streams)

    # -- interface -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def open_stream(self, on_event: EventCallback, *, delay_ms: int | None = None) -> int:
        session = StreamingSession(self.model, self.tokenizer, delay_ms=delay_ms)  # validates the delay
        with self._lock:
            live = sum(1 for s in self._streams.values() if not s.closed)
            if live >= self.max_streams:
                raise AdmissionError(f"engine is full: {live} of {self.max_streams} streams in use")
            sid = self._next_id
            self._next_id += 1
            self._streams[sid] = _Stream(session, on_event)
            self._stats.active_streams = live + 1
        return sid

    def _get(self, stream_id: int) -> _Stream:
        s = self._streams.get(stream_id)
        if s is None or s.closed:
            raise StreamError(f"unknown or closed stream {stream_id}")
        return s

    def push_audio(self, stream_id: int, samples: np.ndarray) -> None:
        arr = as_mono_float32(samples, owned=True)  # kept until a step reads it: the caller may reuse its buffer
        with self._lock:
            s = self._get(stream_id)
            if s.finish_requested:
                raise StreamError(f"stream {stream_id} is finished: no more audio")
            if arr.size:
                s.pending.append(arr)
                s.pending_samples += arr.size
                self._wake.notify_all()

    def finish_stream(self, stream_id: int) -> None:
        with self._lock:
            s = self._get(stream_id)
            s.finish_requested = True
            self._wake.notify_all()

    def close_stream(self, stream_id: int) -> None:
        with self._lock:
            s = self._streams.pop(stream_id, None)
            self._stats.active_streams = len(self._streams)
        if s is not None:
            with s.notify_lock:  # outside the engine lock, which a callback may take
                s.closed = True

    def pending_audio_seconds(self, stream_id: int) -> float:
        with self._lock:
            s = self._streams.get(stream_id)
            return 0.0 if s is None else s.pending_samples / self.config.audio.sampling_rate

    def stats(self) -> EngineStats:
        with self._lock:
            st = EngineStats(self._stats.active_streams, self.max_streams, self._stats.steps,
                             list(self._stats.step_seconds), self._stats.tokens_emitted)
        return st

    # -- engine thread -------------------------------------------------------------------------
    def _next_work(self) -> tuple[int, _Stream, np.ndarray | None, bool] | None:
        for sid, s in self._streams.items():
            if s.done:
                continue
            if s.pending:
                chunk = s.pending.popleft()
                if chunk.size > self._chunk:
                    s.pending.appendleft(chunk[self._chunk:])
                    chunk = chunk[: self._chunk]
                s.pending_samples -= chunk.size
                return sid, s, chunk, False
            if s.finish_requested:
                return sid, s, None, True
        return None

    def _loop(self) -> None:
        while True:
            with self._lock:
                work = None
                while not self._stop and (work := self._next_work()) is None:
                    self._wake.wait(timeout=0.5)
                if self._stop:
                    return
                # move the served stream to the back: round-robin between streams
                sid, s, chunk, finish = work
                self._streams[sid] = self._streams.pop(sid)
            t0 = time.perf_counter()
            try:
                events = s.session.finish() if finish else s.session.push_audio(chunk)
                error = None
            except Exception as exc:  # one stream's failure never stops the engine
                logger.exception("stream %d failed", sid)
                events, error = [], f"{type(exc).__name__}: {exc}"
            dt = time.perf_counter() - t0
            with self._lock:
                if s.closed:
                    continue
                self._stats.steps += 1
                self._stats.step_seconds.append(dt)
                del self._stats.step_seconds[:-1000]
                self._stats.tokens_emitted += len(events)
                if error is not None or finish:
                    s.done = True
            for ev in events:
                if ev.token_id >= 0:
                    s.notify(StreamToken(sid, ev.token_id, ev.text, ev.position, ev.audio_end_ms))
                elif ev.text:  # flushed bytes of an unfinished character at the end
                    s.notify(StreamToken(sid, -1, ev.text, ev.position, ev.audio_end_ms))
            if error is not None:
                s.notify(StreamFailed(sid, error))
            elif finish:
                sess = s.session
                s.notify(StreamDone(sid, sess.text, len(sess.prompt), len(sess.generated), sess.ended_by_eos))
