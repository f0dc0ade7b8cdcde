"""One websocket session: the receive loop, the send task and the rules they share.

* Receiving and sending are separate tasks, so a client that sends everything before reading (vLLM's
  example client) works, and a client that does not read never blocks anyone else: its events wait
  in its own bounded outbox.
* Backpressure pauses reading (never drops audio): while the engine holds more than
  `max_pending_audio_s` of this session's audio undecoded, while more than `send_queue_high_bytes`
  wait in the outbox, or while the session holds its quota of engine streams (a new turn while
  two earlier ones still finish), the loop stops calling `recv()`; the websocket library then stops reading the
  socket and TCP flow control slows the client down.
* Idle timeout: no client message for `idle_timeout_s` while nothing is in flight -> `idle_timeout`
  error, then close. Time spent paused by backpressure or waiting for the engine is not idle.
* Keepalive (ours, not the websockets library's): a ping every `ping_interval_s`; a client whose pong has not come
  after `ping_timeout_s` of the receive loop waiting on the socket is dropped (1011). Time the loop spends paused
  by backpressure does not count: a client that uploads faster than the engine decodes has its pong queued in the
  socket behind its own audio, which we are not reading (the library's keepalive cut such sessions).
* Engine stall watchdog: queued work that sees no engine progress for `engine_stall_timeout_s` ->
  `engine_stalled` error, then close (an open socket never stalls silently).
* The dialect is chosen by the URL (`?intent=transcription` or `?model=` -> OpenAI) or else by the
  client's first event: a `session.update` carrying a `session` object speaks OpenAI, anything
  else speaks vLLM. Until then `session.created` carries the fields of both.
* Every message problem becomes an error event and the session goes on; when the session ends for
  any reason, every engine stream it opened is closed.
* Server shutdown (`shut_down`): the session reads no more messages (a message being handled is finished; audio
  the client has not sent yet is not awaited), its running turns end as a final commit would end them, their
  transcripts go out, then an `server_shutting_down` error event and a 1001 (going away) close.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from realtime.serving import TranscriptionEngine

from .engine_stream import EngineEvents, EngineStream
from .events import UNPAIRED_SURROGATE, ProtocolError, dumps, has_unpaired_surrogate, new_id
from .metrics import Metrics
from .settings import ServerSettings

logger = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN_LATER = 1013


@dataclass
class SessionUsage:
    """What one session used, for its line in the server log when it ends."""

    audio_s: float = 0.0  # received from the client, at the client's rate
    tokens: int = 0
    turns: int = 0  # utterances (vLLM) or items (OpenAI) transcribed
    errors: int = 0  # error events sent


@dataclass
class ServerContext:
    """What every session shares: settings, the engine, metrics, the VAD thread pool."""

    settings: ServerSettings
    engine: TranscriptionEngine
    metrics: Metrics
    vad_executor: Executor
    started_at: float = field(default_factory=time.time)
    _engine_events: EngineEvents | None = field(default=None, repr=False)

    def engine_events(self, loop: asyncio.AbstractEventLoop) -> EngineEvents:
        """The engine -> loop event queue every session of this server on `loop` shares."""
        if self._engine_events is None or self._engine_events.loop is not loop:
            self._engine_events = EngineEvents(loop)
        return self._engine_events

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return self.settings.served_model_names


class Dialect(Protocol):
    name: str

    def session_created(self) -> dict[str, Any]: ...

    async def handle(self, event: dict[str, Any]) -> None: ...

    def error_event(self, err: ProtocolError, client_event_id: str | None) -> dict[str, Any]: ...

    def streams(self) -> Iterable[EngineStream]: ...

    def backlogged(self) -> bool:
        """True while the session holds as many engine streams as it may (reading pauses)."""
        ...

    def close(self) -> None: ...

    async def end_input(self) -> None:
        """The server is shutting down: end every running turn as the client's final commit would (all audio
        received is transcribed), including audio still waiting for a commit."""
        ...


class Outbox:
    """Events waiting to be sent, with their byte count (the backpressure signal)."""

    def __init__(self) -> None:
        self._items: deque[tuple[str | None, float | None, tuple[int, str] | None]] = deque()
        self._ready = asyncio.Event()
        self.bytes = 0

    def put(self, text: str, arrival: float | None) -> None:
        self._items.append((text, arrival, None))
        self.bytes += len(text)
        self._ready.set()

    def put_close(self, code: int, reason: str) -> None:
        self._items.append((None, None, (code, reason)))
        self._ready.set()

    async def get(self) -> tuple[str | None, float | None, tuple[int, str] | None]:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if item[0] is not None:
            self.bytes -= len(item[0])
        return item


def wants_openai(query: dict[str, list[str]]) -> bool:
    return query.get("intent", [""])[0] == "transcription" or bool(query.get("model"))


def is_openai_session_update(event: dict[str, Any]) -> bool:
    return event.get("type") == "session.update" and isinstance(event.get("session"), dict)


class Connection:
    def __init__(self, ws: ServerConnection, ctx: ServerContext, query: dict[str, list[str]], client: str = "",
                 initial_session: dict[str, Any] | None = None) -> None:
        """client: who opened it, for logs and per-client quotas ("key #N" or the peer's address);
        initial_session: the session configuration of the client secret it connected with (OpenAI dialect)."""
        from .openai_dialect import OpenAIDialect
        from .vllm_dialect import VllmDialect

        self.ws, self.ctx = ws, ctx
        self.settings, self.metrics, self.engine = ctx.settings, ctx.metrics, ctx.engine
        self.loop = asyncio.get_running_loop()
        self.engine_events = ctx.engine_events(self.loop)
        self.session_id = new_id("sess-", 16)  # vLLM's form: "sess-" + 32 hex digits
        self.created = int(time.time())
        self.outbox = Outbox()
        self.client = client
        self.usage = SessionUsage()
        self._closing = False
        self._shutting_down = False
        self._receiver: asyncio.Task[None] | None = None
        self._last_activity = time.monotonic()
        self._reading = False  # the receive loop waits on the socket (a pong could arrive now)
        self.dialect: Dialect
        self._initial_error: ProtocolError | None = None
        if wants_openai(query) or initial_session is not None:
            openai = OpenAIDialect(self)
            if initial_session is not None:
                try:
                    openai.start_from(initial_session)
                except ProtocolError as err:  # valid when issued; the server's models may have changed since
                    self._initial_error = err
            self.dialect, self._undecided = openai, False
            self.metrics.sessions_by_dialect.inc("openai")
        else:
            self.dialect, self._undecided = VllmDialect(self), True

    # -- used by dialects ---------------------------------------------------------------------
    def send(self, event: dict[str, Any], *, arrival: float | None = None) -> None:
        """Queue an event; `arrival` (monotonic) marks a delta whose emission delay to measure."""
        if not self._closing:
            self.outbox.put(dumps(event), arrival)

    def count_audio(self, seconds: float) -> None:
        self.metrics.audio_seconds.inc(amount=seconds)
        self.usage.audio_s += seconds

    def count_token(self) -> None:
        self.metrics.tokens.inc()
        self.usage.tokens += 1

    def count_error(self, code: str) -> None:
        self.metrics.errors.inc(code)
        self.usage.errors += 1

    def send_error(self, err: ProtocolError, client_event_id: str | None = None) -> None:
        self.count_error(err.code)
        logger.info("session %s: error %s: %s", self.session_id, err.code, err.detail or err.message)
        self.send(self.dialect.error_event(err, client_event_id))

    def touch(self) -> None:
        """Something happened (a message, or an engine outcome): restart the idle clock."""
        self._last_activity = time.monotonic()

    def close_after_flush(self, code: int, reason: str) -> None:
        if not self._closing:
            self.outbox.put_close(code, reason)
            self._closing = True

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop(), name=f"send-{self.session_id}")
        watchdog = asyncio.create_task(self._watchdog(), name=f"watchdog-{self.session_id}")
        keepalive = asyncio.create_task(self._keepalive(), name=f"keepalive-{self.session_id}")
        receiver = self._receiver = asyncio.create_task(self._receive_loop(), name=f"recv-{self.session_id}")
        try:
            self.send(self.dialect.session_created())
            if self._initial_error is not None:  # the session started with the defaults instead: say why
                self.send_error(self._initial_error)
            # The session ends when the client goes away (receiver ends), when we close it after
            # flushing (sender ends), or when sending fails.
            await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if receiver.done() and not sender.done() and self._shutting_down:
                # shut_down stopped the reading: its transcripts and the close are still to be sent
                await asyncio.wait({sender}, timeout=self.settings.shutdown_flush_s + self.settings.close_timeout_s + 1)
            elif receiver.done() and not sender.done() and self._closing:
                await asyncio.wait({sender}, timeout=5)
        finally:
            for t in (receiver, watchdog, keepalive, sender):
                t.cancel()
            results = await asyncio.gather(receiver, watchdog, keepalive, sender, return_exceptions=True)
            for r in results:
                if isinstance(r, Exception):  # a bug: the session ends, the server goes on
                    logger.error("session %s: task failed", self.session_id, exc_info=r)
            self.dialect.close()
            if self._undecided:
                self.metrics.sessions_by_dialect.inc("none")

    async def _send_loop(self) -> None:
        try:
            while True:
                text, arrival, close = await self.outbox.get()
                if close is not None:
                    await self.ws.close(*close)
                    return
                assert text is not None
                await self.ws.send(text)
                if arrival is not None:
                    self.metrics.emission_delay.observe(time.monotonic() - arrival)
        except ConnectionClosed:
            return

    def _pending_audio(self) -> float:
        return sum(s.pending_audio_seconds() for s in self.dialect.streams())

    def _busy(self) -> bool:
        return any(s.awaiting_engine for s in self.dialect.streams())

    def _pause_cause(self) -> str | None:
        if self._pending_audio() > self.settings.max_pending_audio_s:
            return "engine_backlog"
        if self.outbox.bytes > self.settings.send_queue_high_bytes:
            return "send_queue"
        if self.dialect.backlogged():
            return "stream_quota"
        return None

    async def wait_for_stream_room(self) -> None:
        """Until the dialect may open another engine stream (`backlogged` is false): one message can hold several
        turns, and the receive loop checks the quota only between messages. Reading stays paused meanwhile, as it
        does between messages; a closing or shutting-down session stops waiting."""
        if not self.dialect.backlogged():
            return
        self.metrics.read_pauses.inc("stream_quota")
        while not self._closing and not self._shutting_down and self.dialect.backlogged():
            await asyncio.sleep(0.005)

    async def _wait_while_backpressured(self) -> None:
        cause = self._pause_cause()
        if cause is None:
            return
        self.metrics.read_pauses.inc(cause)
        while not self._closing and not self._shutting_down and self._pause_cause() is not None:
            await asyncio.sleep(0.005)
        self.touch()  # waiting on us is not the client being idle

    async def _receive_loop(self) -> None:
        idle = self.settings.idle_timeout_s
        while not self._closing and not self._shutting_down:
            await self._wait_while_backpressured()
            if self._closing or self._shutting_down:  # nothing awaits between here and recv(): see shut_down
                return
            remaining = idle - (time.monotonic() - self._last_activity) if math.isfinite(idle) else None
            try:
                if remaining is not None and remaining <= 0:
                    raise TimeoutError
                async with asyncio.timeout(remaining):
                    self._reading = True
                    try:
                        message = await self.ws.recv()
                    finally:
                        self._reading = False
            except TimeoutError:
                if self._busy():
                    self.touch()
                    continue
                self.send_error(ProtocolError("idle_timeout",
                                              f"No audio or events for {idle:g} s; closing the session"))
                self.close_after_flush(CLOSE_NORMAL, "idle timeout")
                return
            except ConnectionClosed:
                return
            self.touch()
            await self._handle_message(message)

    async def _handle_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self.send_error(ProtocolError("invalid_event", "Binary frames are not supported: send JSON text events"))
            return
        limit = self.settings.max_message_bytes
        if len(message) > limit:
            self.send_error(ProtocolError(
                "message_too_large", f"Message of {len(message)} characters is over the {limit} limit; "
                "split audio into smaller appends"))
            return
        try:
            event = json.loads(message)
        except (ValueError, RecursionError):
            self.send_error(ProtocolError("invalid_json", "Invalid JSON"))
            return
        if not isinstance(event, dict):
            self.send_error(ProtocolError("invalid_event", "An event must be a JSON object with a `type`"))
            return
        client_event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        # only `\\u` escapes spell unpaired surrogates (a UTF-8 text frame cannot hold one); audio appends have none
        if "\\u" in message and has_unpaired_surrogate(event):
            if client_event_id is not None and has_unpaired_surrogate(client_event_id):
                client_event_id = None
            self.send_error(ProtocolError("invalid_json", f"Invalid JSON: {UNPAIRED_SURROGATE}"), client_event_id)
            return
        if self._undecided:
            self._undecided = False
            if is_openai_session_update(event):
                from .openai_dialect import OpenAIDialect

                self.dialect = OpenAIDialect(self)
            self.metrics.sessions_by_dialect.inc(self.dialect.name)
        try:
            await self.dialect.handle(event)
        except ProtocolError as err:
            self.send_error(err, client_event_id)
        except Exception as exc:  # a bug or engine failure in one event must not end the session
            logger.exception("session %s: event %r failed", self.session_id, event.get("type"))
            self.send_error(ProtocolError("processing_error", f"{type(exc).__name__}: {exc}"), client_event_id)

    async def shut_down(self, flush_s: float) -> None:
        """The server is going away: read no more, end the running turns as a final commit would, send their
        transcripts (waiting at most `flush_s` for the engine), then `server_shutting_down` and a 1001 close."""
        if self._closing or self._shutting_down:
            return
        self._shutting_down = True
        receiver = self._receiver
        if receiver is not None and not receiver.done():
            if self._reading:
                receiver.cancel()  # waiting in recv(): cancelling it loses no message (websockets guarantees)
            # otherwise it is handling a message (finished first) or paused by backpressure (it stops now)
            await asyncio.wait({receiver}, timeout=flush_s)
        if self._closing:  # the message being handled ended the session
            return
        try:
            await self.dialect.end_input()
        except ProtocolError as err:
            self.send_error(err)
        except Exception as exc:  # a bug here must not keep the server from stopping
            logger.exception("session %s: ending its turns failed", self.session_id)
            self.send_error(ProtocolError("processing_error", f"{type(exc).__name__}: {exc}"))
        deadline = time.monotonic() + flush_s
        while any(True for _ in self.dialect.streams()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        unfinished = sum(1 for _ in self.dialect.streams())
        if unfinished:
            logger.warning("session %s: %d turn(s) not finished within %.0f s of shutdown", self.session_id,
                           unfinished, flush_s)
            message = (f"The server is shutting down; {unfinished} transcription(s) could not be finished within "
                       f"{flush_s:g} s. Reconnect to continue")
        else:
            message = ("The server is shutting down; every transcription of this session is complete. "
                       "Reconnect to continue")
        self.send_error(ProtocolError("server_shutting_down", message))
        self.close_after_flush(CLOSE_GOING_AWAY, "server shutting down")

    async def _keepalive(self) -> None:
        """Ping every `ping_interval_s`; drop the client when `ping_timeout_s` of reading passes without its pong.
        Closing the socket ends the receive loop and with it the session."""
        interval, timeout = self.settings.ping_interval_s, self.settings.ping_timeout_s
        if not interval:
            return
        while not self._closing:
            await asyncio.sleep(interval)
            try:
                async with asyncio.timeout(timeout):  # writing waits while the client leaves our data unread
                    pong = await self.ws.ping()
            except ConnectionClosed:
                return
            except TimeoutError:
                return await self._drop_unresponsive(timeout)
            # a close sets ConnectionClosed on a pong still awaited: retrieve it so asyncio does not report it
            pong.add_done_callback(lambda f: f.cancelled() or f.exception())
            if not timeout:
                continue
            # a tenth of the timeout per look (2 s at the default): a thousand sessions waiting on pongs behind
            # backlogged audio cost the event loop a few hundred wake-ups a second, not tens of thousands
            poll, unanswered = max(0.05, timeout / 10), 0.0
            while not pong.done():
                t0, reading = time.monotonic(), self._reading
                await asyncio.wait({pong}, timeout=poll)
                if reading and self._reading:  # asking for data all along: the client could have answered
                    unanswered += time.monotonic() - t0
                if unanswered >= timeout:
                    return await self._drop_unresponsive(timeout)

    async def _drop_unresponsive(self, timeout: float) -> None:
        logger.info("session %s: no pong after %.1f s of reading; closing", self.session_id, timeout)
        self.metrics.keepalive_timeouts.inc()
        self._closing = True
        try:
            async with asyncio.timeout(self.settings.close_timeout_s or 1.0):
                await self.ws.close(CLOSE_INTERNAL_ERROR, "keepalive ping timeout")
        except TimeoutError:
            self.ws.transport.abort()  # a hung peer does not finish the closing handshake

    async def _watchdog(self) -> None:
        limit = self.settings.engine_stall_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            stalled = [s for s in self.dialect.streams() if s.awaiting_engine and now - s.last_progress > limit]
            if stalled:
                logger.error("session %s: engine made no progress for %.0f s", self.session_id, limit)
                self.send_error(ProtocolError("engine_stalled",
                                              f"The engine made no progress on this session for {limit:g} s"))
                self.close_after_flush(CLOSE_INTERNAL_ERROR, "engine stalled")
                return
