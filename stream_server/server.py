"""The websocket server: handshake checks, HTTP routes, session admission, engine stats polling.

Handshake order for `/v1/realtime`: Origin check (403), API key (401), then the upgrade. A full
server still completes the upgrade and then sends a `server_full` error event and closes with 1013
(try again later), so every client sees why instead of hanging or guessing from an HTTP status.

Shutdown: `stop()` closes every session at once (1001); `shut_down()` is the graceful one that SIGTERM and SIGINT
run (`ServerSettings.drain_timeout_s`): new sessions get `server_shutting_down` (1001), /health answers 503
"draining", live sessions go on until they end or the drain time is up, then each one's running turns are
finished and their transcripts sent before it is closed (`Connection.shut_down`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from realtime.config import ConfigError
from realtime.serving import AdmissionError, TranscriptionEngine, fits_step_cost

from . import auth
from .admission import LoadAdmission
from .calibration import CalibrationReport, calibrate_or_warn
from .client_secrets import ClientSecrets, EphemeralGrant, is_ephemeral
from .connection import CLOSE_GOING_AWAY, CLOSE_TRY_AGAIN_LATER, Connection, ServerContext, wants_openai
from .engine_stream import EngineStream
from .events import ProtocolError, dumps
from .http import HttpRoutes, error_response
from .http_connection import HttpAwareConnection, HttpReply, connection_factory
from .http_requests import HttpError, HttpRequest
from .loop_lag import LoopLag, loop_lag_refusal
from .transcriptions import TRANSCRIPTIONS_PATH, OnEnd, OnToken, protocol_error_status, serve_transcription
from .metrics import Metrics
from .openai_dialect import OpenAIDialect
from .vllm_dialect import VllmDialect
from .settings import REALTIME_PATH, ServerSettings

logger = logging.getLogger(__name__)

CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
HANDSHAKE_TIMEOUT_S = 10.0  # websockets' default open_timeout: the TLS and websocket handshakes, the request line
UPLOAD_READ_TIMEOUT_S = 30.0  # an upload that sends nothing for this long (or the idle timeout, if shorter) gets 408


class StreamServer:
    """Serves one engine. `start()` binds (port 0 picks a free port: see `port`); `stop()` ends all."""

    def __init__(self, settings: ServerSettings, engine: TranscriptionEngine, *, owns_engine: bool = True) -> None:
        self.settings = settings
        self.engine = engine
        self.owns_engine = owns_engine
        self.metrics = Metrics()
        self.ctx = ServerContext(settings, engine, self.metrics,
                                 ThreadPoolExecutor(max_workers=2, thread_name_prefix="vad"))
        self.active: set[Connection] = set()
        self.http_jobs: set[HttpAwareConnection] = set()  # file transcriptions running (they count as sessions)
        # uploads whose head passed and whose body is still arriving: they hold an upload slot too, so that bodies in
        # flight (up to --max-upload-mb each, in memory) are bounded by --max-uploads like running ones
        self.http_receiving: set[HttpAwareConnection] = set()
        self.connections: set[HttpAwareConnection] = set()  # every open connection (websocket or HTTP)
        self.client_secrets = ClientSecrets(settings.api_keys)
        self._sessions_of: Counter[str] = Counter()  # open sessions per client (`_client_of`)
        self._load = LoadAdmission(settings.max_step_ms)  # --max-step-ms: the measured and the foreseen step
        self.loop_lag = LoopLag()  # how late the event loop runs timers: the host side's load (--max-loop-lag-ms)
        self._lag_task: asyncio.Task[None] | None = None
        self.calibration: CalibrationReport | None = None  # the start-up step-cost calibration, if it ran
        self._server: Server | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self._stopped = False
        self.draining = False
        self.routes = HttpRoutes(demo_dir=settings.demo_dir, served_model_names=settings.served_model_names,
                                 created=int(self.ctx.started_at), health=self._health,
                                 metrics_text=self._metrics_text)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        if not s.served_model_names:
            raise ValueError("at least one served model name is needed")
        if self.owns_engine:
            self.engine.start()
        if s.calibrate_on_start and s.max_step_ms:
            if fits_step_cost(self.engine):
                # before binding: no client shares the engine with the noise, and the first burst meets a line
                self.calibration = await asyncio.to_thread(calibrate_or_warn, self.engine, limit_ms=s.max_step_ms,
                                                           max_streams=s.max_sessions)
            else:
                logger.info("not calibrating the step cost: %s fits none (only the measured step admits)",
                            type(self.engine).__name__)
        ssl_context = s.ssl_context()
        tls_kw = {"ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S} if ssl_context is not None else {}
        self._server = await serve(
            self._handle, s.host, s.port,
            ssl=ssl_context,
            **tls_kw,
            # POST requests (file uploads) are read and answered by the connection itself; it also applies the
            # handshake timeout, since the library's would cut off a long transcription
            create_connection=connection_factory(self._handle_http, self._check_http_head,
                                                 max_body_bytes=s.max_upload_bytes, open_timeout=HANDSHAKE_TIMEOUT_S,
                                                 read_timeout=min(s.idle_timeout_s, UPLOAD_READ_TIMEOUT_S),
                                                 registry=self.connections),
            open_timeout=None,
            process_request=self._process_request,
            select_subprotocol=self._select_subprotocol,
            compression=None,  # audio is incompressible base64: deflate would only cost CPU and memory
            max_size=s.max_message_bytes * s.transport_max_factor,
            max_queue=4,  # frames buffered before the library stops reading the socket (backpressure)
            ping_interval=None,  # Connection runs its own keepalive, which knows when we hold reading back
            ping_timeout=None,
            close_timeout=s.close_timeout_s,
            reuse_port=s.reuse_port,
        )
        self._stats_task = asyncio.create_task(self._poll_stats(), name="engine-stats")
        self._lag_task = asyncio.create_task(self.loop_lag.run(), name="loop-lag")
        logger.info("listening on %s://%s:%d%s (models: %s; auth %s)", s.ws_scheme, s.host, self.port, REALTIME_PATH,
                    ", ".join(s.served_model_names), "on" if s.auth_enabled else "off")

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._stats_task is not None:
            self._stats_task.cancel()
        if self._lag_task is not None:
            self._lag_task.cancel()
        for conn in list(self.http_jobs):
            conn.abort_http()  # answered 503 and closed; their engine streams are closed
        for conn in list(self.connections):  # requests still arriving: 503, or closed if not one whole yet
            conn.abort_read(HttpError(503, "server_shutting_down", "The server is shutting down"))
        if self._server is not None:
            self._server.close(close_connections=True)  # 1001 going away to every session
            await self._server.wait_closed()
        if self.owns_engine:
            await asyncio.to_thread(self.engine.stop)
        self.ctx.vad_executor.shutdown(wait=False, cancel_futures=True)

    async def shut_down(self) -> None:
        """Graceful stop: refuse new sessions, give live ones `drain_timeout_s` to end on their own, then finish
        their running turns, send the transcripts and close them (each within `shutdown_flush_s`), then `stop()`."""
        if self._stopped:
            return
        s = self.settings
        self.draining = True
        logger.info("shutting down: %d live session(s), up to %g s to end on their own", len(self.active),
                    s.drain_timeout_s)
        if not await self._sessions_end_within(s.drain_timeout_s):
            remaining = list(self.active)
            logger.info("drain time is up: finishing the turns of %d session(s)", len(remaining))
            self.metrics.shutdown_flushed_sessions.inc(amount=len(remaining))
            await asyncio.gather(*(c.shut_down(s.shutdown_flush_s) for c in remaining))
            await self._sessions_end_within(s.close_timeout_s + 1)
        await self.stop()

    async def _sessions_end_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while (self.active or self.http_jobs) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self.active and not self.http_jobs

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    # -- handshake ------------------------------------------------------------------------------
    def _select_subprotocol(self, connection: ServerConnection, offered: Sequence[str]) -> str | None:
        # Browsers fail a handshake whose response names none of the subprotocols they offered, so
        # one must be picked: "realtime" (OpenAI's browser clients offer it next to the key entry),
        # else any entry that carries no key, and only as a last resort the key entry itself (the
        # client sent it in this very handshake, so echoing it reveals nothing new).
        if not offered:
            return None
        if "realtime" in offered:
            return "realtime"
        plain = [p for p in offered if not p.startswith(auth.KEY_SUBPROTOCOL_PREFIX)]
        return plain[0] if plain else offered[0]

    @staticmethod
    def _offered_key(request: Request) -> str | None:
        """The key a handshake or GET request carries: header, query or subprotocol (`auth.extract_api_key`)."""
        protos = auth.offered_subprotocols(request.headers.get_all("Sec-WebSocket-Protocol"))
        return auth.extract_api_key(request.headers.get("Authorization"), request.path, protos)

    def _key_index(self, request: Request) -> int | None:
        """Which configured API key the request carries (None: none of them)."""
        return auth.key_index(self._offered_key(request), self.settings.api_keys)

    def _authorized(self, request: Request) -> bool:
        """An API key (or auth off): the HTTP routes. Client secrets open realtime sessions only."""
        return not self.settings.auth_enabled or self._key_index(request) is not None

    def _grant(self, request: Request) -> EphemeralGrant | None:
        """The valid client secret the handshake carries, if any (`client_secrets.py`)."""
        key = self._offered_key(request)
        return self.client_secrets.verify(key, time.time()) if is_ephemeral(key) else None

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        is_upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
        if not is_upgrade:
            if path == REALTIME_PATH:
                return error_response(426, "upgrade_required", f"{REALTIME_PATH} is a websocket endpoint",
                                      {"Upgrade": "websocket"})
            return await self.routes.handle(unquote(path), authorized=self._authorized(request))
        if path != REALTIME_PATH:
            self.metrics.rejected.inc("not_found")
            return error_response(404, "not_found", f"no websocket endpoint at {path}; use {REALTIME_PATH}")
        origin = request.headers.get("Origin")
        if not auth.origin_allowed(origin, request.headers.get("Host"), self.settings.allowed_origins,
                                   auth_enabled=self.settings.auth_enabled):
            self.metrics.rejected.inc("origin")
            logger.warning("refused websocket from origin %r", origin)
            return error_response(403, "origin_not_allowed", f"Origin {origin} is not allowed (see --allowed-origins)")
        if not self._authorized(request) and self._grant(request) is None:
            self.metrics.rejected.inc("unauthorized")
            return error_response(401, "invalid_api_key", "Missing or invalid API key (or an expired client secret)",
                                  {"WWW-Authenticate": "Bearer"})
        return None

    # -- sessions -------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path).query) if ws.request is not None else {}
        if self.draining:
            await self._refuse(ws, query, ProtocolError(
                "server_shutting_down", "The server is shutting down and takes no new sessions; connect to another "
                "instance or try again later"), CLOSE_GOING_AWAY, "server shutting down")
            return
        if self._sessions_open() >= self.settings.max_sessions:
            await self._refuse(ws, query, ProtocolError(
                "server_full", f"The server is full ({self.settings.max_sessions} sessions); try again later"),
                CLOSE_TRY_AGAIN_LATER, "server full")
            return
        client = self._client_of(ws)
        quota = self.settings.max_sessions_per_client
        if quota and self._sessions_of[client] >= quota:
            await self._refuse(ws, query, ProtocolError(
                "too_many_sessions", f"This client ({client}) already has {quota} sessions open, the most one client "
                "may hold; close one or try again later"), CLOSE_TRY_AGAIN_LATER, "too many sessions")
            return
        busy = self._busy()
        if busy is not None:
            await self._refuse(ws, query, ProtocolError("server_busy", busy), CLOSE_TRY_AGAIN_LATER,
                               "at capacity")
            return
        grant = self._grant(ws.request) if ws.request is not None else None
        # a client secret opens an OpenAI transcription session, with its configuration or the defaults ({})
        conn = Connection(ws, self.ctx, query, client, None if grant is None else (grant.session or {}))
        self.active.add(conn)
        self._sessions_of[client] += 1
        self.metrics.sessions_active.set(len(self.active))
        self.metrics.sessions_total.inc()
        t0 = time.monotonic()
        try:
            await conn.run()
        except Exception:
            logger.exception("session %s crashed", conn.session_id)
        finally:
            self.active.discard(conn)
            self._release_client(client)
            self.metrics.sessions_active.set(len(self.active))
            seconds = time.monotonic() - t0
            self.metrics.session_seconds.observe(seconds)
            u = conn.usage
            # one line per session, like an access log (the key's number, never the key)
            logger.info("session %s (%s, %s) ended after %.1f s: %.1f s of audio, %d turn(s), %d token(s), "
                        "%d error event(s), close %s %s", conn.session_id, client, conn.dialect.name, seconds,
                        u.audio_s, u.turns, u.tokens, u.errors, ws.close_code, ws.close_reason or "")

    def _release_client(self, client: str) -> None:
        """One session or transcription of `client` ended (the per-client quota's count)."""
        self._sessions_of[client] -= 1
        if not self._sessions_of[client]:
            del self._sessions_of[client]

    def _sessions_open(self) -> int:
        return len(self.active) + len(self.http_jobs)

    # -- file transcription (POST /v1/audio/transcriptions) ----------------------------------------
    def _check_http_head(self, request: HttpRequest, conn: HttpAwareConnection) -> HttpError | None:
        """Refusals decided by the request's head alone, before its body is read (the connection sends them)."""
        path = urlsplit(request.target).path
        if path == CLIENT_SECRETS_PATH:
            if request.method != "POST":
                return HttpError(405, "method_not_allowed", f"{path} takes POST, not {request.method}")
            if self.settings.auth_enabled and self._http_key_index(request) is None:
                self.metrics.rejected.inc("unauthorized")
                return HttpError(401, "invalid_api_key", "Missing or invalid API key (client secrets are made with an "
                                 "API key, never with another client secret)")
            return None
        if path != TRANSCRIPTIONS_PATH:
            if path == REALTIME_PATH or path in ("/health", "/metrics", "/v1/models"):
                return HttpError(405, "method_not_allowed", f"{path} takes GET, not {request.method}")
            return HttpError(404, "not_found", f"{request.method} {path}: no such endpoint (file uploads go to "
                             f"POST {TRANSCRIPTIONS_PATH})")
        origin = request.header("origin")
        if origin is not None:  # a browser page: cross-origin ones only when allowed (as for the websocket)
            if not auth.origin_allowed(origin, request.header("host"), self.settings.allowed_origins,
                                       auth_enabled=self.settings.auth_enabled):
                self.metrics.rejected.inc("origin")
                return HttpError(403, "origin_not_allowed", f"Origin {origin} is not allowed (see --allowed-origins)")
            conn.response_headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if request.method == "OPTIONS":  # a CORS preflight: answered by `_handle_http`, without key or capacity
            return None
        if request.method != "POST":
            return HttpError(405, "method_not_allowed", f"{TRANSCRIPTIONS_PATH} takes POST, not {request.method}")
        if self.settings.auth_enabled and self._http_key_index(request) is None:
            self.metrics.rejected.inc("unauthorized")
            return HttpError(401, "invalid_api_key", "Missing or invalid API key")
        refusal = self._http_refusal(self._http_client(request, conn))
        if refusal is not None:
            self.metrics.rejected.inc(refusal.code)
        else:
            self.http_receiving.add(conn)
        return refusal

    def _http_refusal(self, client: str) -> HttpError | None:
        if self.draining or self._stopped:
            return HttpError(503, "server_shutting_down", "The server is shutting down and takes no new requests; "
                             "try another instance or again later")
        if self._sessions_open() >= self.settings.max_sessions:
            return HttpError(503, "server_full", f"The server is full ({self.settings.max_sessions} sessions and "
                             "transcriptions); try again later")
        # a body that stopped arriving (its connection closed or its request failed) gives its slot back here
        self.http_receiving = {c for c in self.http_receiving if not c.transport.is_closing() and c.receiving_body}
        if len(self.http_jobs) + len(self.http_receiving) >= self.settings.max_uploads:
            return HttpError(503, "server_busy", f"All {self.settings.max_uploads} upload slots are in use "
                             "(--max-uploads); try again shortly")
        quota = self.settings.max_sessions_per_client
        if quota and self._sessions_of[client] >= quota:
            return HttpError(429, "too_many_sessions", f"This client ({client}) already has {quota} sessions open, "
                             "the most one client may hold; try again later")
        busy = self._busy()
        if busy is not None:
            return HttpError(503, "server_busy", busy)
        return None

    def _busy(self) -> str | None:
        """Why one more session or upload would overload the service, or None: the engine (its measured or foreseen
        step, --max-step-ms) or the host side (its event loop's lag, --max-loop-lag-ms)."""
        return self._engine_busy() or loop_lag_refusal(self.loop_lag, time.monotonic(), self.settings.max_loop_lag_ms)

    def _engine_busy(self) -> str | None:
        """Why one more session or upload would overload the engine (admission.LoadAdmission), or None. Load the
        engine cannot report never refuses anyone."""
        if not self.settings.max_step_ms:
            return None
        try:
            stats = self.engine.stats()
        except Exception:  # /health reports a failing engine; admission does not guess
            logger.exception("engine.stats() failed")
            return None
        return self._load.refusal(stats, self._sessions_open())

    def _http_key_index(self, request: HttpRequest) -> int | None:
        """Which API key an HTTP request carries (Bearer header or ?api_key=)."""
        key = auth.extract_api_key(request.header("authorization"), request.target, [])
        return auth.key_index(key, self.settings.api_keys)

    def _http_client(self, request: HttpRequest, conn: HttpAwareConnection) -> str:
        if self.settings.auth_enabled:
            index = self._http_key_index(request)
            if index is not None:
                return f"key #{index + 1}"
        peer = conn.remote_address
        return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"

    async def _handle_http(self, request: HttpRequest, reply: HttpReply, conn: HttpAwareConnection) -> None:
        if urlsplit(request.target).path == CLIENT_SECRETS_PATH:
            key_index = self._http_key_index(request) if self.settings.auth_enabled else None
            try:
                reply.send_json(200, self.client_secrets.create(
                    request.body, key_index=key_index, served=self.settings.served_model_names,
                    default_delay_ms=self.engine.config.streaming.default_delay_ms))
            except ProtocolError as err:
                reply.fail(400, err.code, err.message, err.param)
            return
        if request.method == "OPTIONS":
            reply.send(204, b"", "", {"Allow": "POST, OPTIONS", "Access-Control-Allow-Methods": "POST",
                                      "Access-Control-Allow-Headers": "authorization, content-type",
                                      "Access-Control-Max-Age": "600"})
            return
        client = self._http_client(request, conn)
        self.http_receiving.discard(conn)  # its body is here: from now on it counts among the running uploads
        refusal = self._http_refusal(client)  # again: the body took time to arrive
        if refusal is not None:
            self.metrics.rejected.inc(refusal.code)
            reply.fail(refusal.status, refusal.code, refusal.message)
            return
        loop = asyncio.get_running_loop()
        events = self.ctx.engine_events(loop)

        def open_stream(delay_ms: int | None, on_token: OnToken, on_end: OnEnd) -> EngineStream:
            return EngineStream(self.engine, events, delay_ms=delay_ms, offset_ms=0, on_token=on_token, on_end=on_end)

        self.http_jobs.add(conn)
        self._sessions_of[client] += 1
        self.metrics.http_active.set(len(self.http_jobs))
        t0, seconds, outcome = time.monotonic(), 0.0, "200"
        try:
            seconds = await serve_transcription(
                request.header("content-type"), request.body, reply,
                served=self.settings.served_model_names, stall_timeout_s=self.settings.engine_stall_timeout_s,
                open_stream=open_stream, max_seconds=self.settings.max_upload_seconds)
            self.metrics.http_audio_seconds.inc(amount=seconds)
        except ProtocolError as err:
            outcome = str(protocol_error_status(err))
            reply.fail(protocol_error_status(err), err.code, err.message, err.param)
        except HttpError as err:
            outcome = str(err.status)
            reply.fail(err.status, err.code, err.message)
        except AdmissionError as err:
            outcome = "503"
            reply.fail(503, "server_full", f"The engine cannot take another stream now: {err.reason}")
        except ConfigError as err:
            outcome = "400"
            reply.fail(400, "invalid_value", str(err))
        except asyncio.CancelledError:
            outcome = "client_gone" if conn.client_left else "503"
            raise
        finally:
            self.http_jobs.discard(conn)
            self._release_client(client)
            self.metrics.http_active.set(len(self.http_jobs))
            self.metrics.http_requests.inc(outcome)
            logger.info("POST %s (%s): %s after %.2f s, %.1f s of audio", TRANSCRIPTIONS_PATH, client, outcome,
                        time.monotonic() - t0, seconds)

    def _client_of(self, ws: ServerConnection) -> str:
        """Who opened `ws`: "key #N" (the N-th configured key, from 1) with keys, else the peer's address."""
        index = self._key_index(ws.request) if self.settings.auth_enabled and ws.request is not None else None
        if index is None and self.settings.auth_enabled and ws.request is not None:
            grant = self._grant(ws.request)  # a client secret counts against the key that issued it
            index = grant.key_index if grant is not None else None
        if index is not None:
            return f"key #{index + 1}"
        peer = ws.remote_address
        return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"

    async def _refuse(self, ws: ServerConnection, query: dict[str, list[str]], err: ProtocolError, close_code: int,
                      reason: str) -> None:
        self.metrics.rejected.inc(err.code)
        self.metrics.errors.inc(err.code)
        # no session exists: the error event in the shape the client's dialect would get it (see Connection)
        event = (OpenAIDialect if wants_openai(query) else VllmDialect).error_event(err, None)
        try:
            await ws.send(dumps(event))
            await ws.close(close_code, reason)
        except ConnectionClosed:  # the client may already be gone
            logger.debug("refused client left before the %s event", err.code)

    # -- stats ----------------------------------------------------------------------------------
    async def _poll_stats(self) -> None:
        while True:
            self._fold_stats()
            await asyncio.sleep(self.settings.stats_interval_s)

    def _fold_stats(self) -> None:
        self.metrics.loop_lag.set(self.loop_lag.recent_s(time.monotonic()))
        self.metrics.loop_lag_worst.set(self.loop_lag.worst_s)
        try:
            self.metrics.record_engine_stats(self.engine.stats())
        except Exception:
            logger.exception("engine.stats() failed")

    def _metrics_text(self) -> str:
        self._fold_stats()
        return self.metrics.render()

    def _health(self) -> dict[str, Any]:
        try:
            stats = self.engine.stats()
            self.metrics.record_engine_stats(stats)
            engine: dict[str, Any] = {"active_streams": stats.active_streams, "max_streams": stats.max_streams,
                                      "steps": stats.steps,
                                      "recent_step_ms": round(stats.recent_step_seconds * 1000, 3),
                                      "recent_step_streams": stats.recent_step_streams,
                                      # the fitted step cost that admission foresees bursts with (0, 0: none yet)
                                      "step_cost_ms": {"fixed": round(stats.step_fixed_seconds * 1000, 3),
                                                       "per_stream": round(stats.step_seconds_per_stream * 1000, 4)}}
            cal = self.calibration
            engine["calibration"] = None if cal is None else {
                "streams": cal.sizes, "median_step_ms": [round(ms, 3) for ms in cal.median_step_ms],
                "seconds": round(cal.seconds, 2)}
            status = "stopping" if self._stopped else "draining" if self.draining else "ok"
        except Exception as exc:  # an engine that cannot even report is not healthy
            engine, status = {"error": f"{type(exc).__name__}: {exc}"}, "error"
        return {"status": status, "models": list(self.settings.served_model_names),
                "active_sessions": len(self.active), "active_transcriptions": len(self.http_jobs),
                "max_sessions": self.settings.max_sessions,
                "engine": engine,
                # how late the event loop runs timers: median of the last 2 s and the worst since start
                "event_loop": {"recent_lag_ms": round(self.loop_lag.recent_s(time.monotonic()) * 1000, 2),
                               "worst_lag_ms": round(self.loop_lag.worst_s * 1000, 2)},
                "uptime_s": round(time.time() - self.ctx.started_at, 1),
                "pid": os.getpid()}  # which server process answered (`--workers`: one of several)
