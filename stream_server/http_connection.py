"""A websockets connection that also serves HTTP requests other than GET (uploads) on the same port.

websockets reads only GET requests without a body: the websocket handshake and the plain GET routes
(`http.py`). This subclass looks at the first bytes of a connection. GET goes to websockets as before. Any
other method is read here (`HttpRequestReader`) and answered by the server's `HttpHandler` through an
`HttpReply`. Then the connection closes. So `OpenAI(base_url="http://host:port/v1")` reaches both
`/v1/realtime` and `/v1/audio/transcriptions`.

websockets' own handshake task still runs for such a connection. `handshake` waits for the reply to
finish and the transport to close, so the library only sees a connection that ended before its
handshake. The handshake timeout is applied here (`open_timeout`), because the library's would also cut
off a long transcription.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.server import ServerConnection

from .http import common_headers, error_body
from .http_requests import HttpError, HttpRequest, HttpRequestReader

logger = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
SNIFF_BYTES = 8  # enough for the longest method we route ("OPTIONS ", "DELETE ")


class HttpReply:
    """The response side of one HTTP request: `send` a whole response, or `start` one and `write` its body
    as it is made (server-sent events). The connection closes after the body (`Connection: close`)."""

    def __init__(self, transport: asyncio.Transport, head_only: bool, headers: dict[str, str] | None = None) -> None:
        self._transport = transport
        self._head_only = head_only
        self._headers = headers or {}  # on every response (the CORS headers of an allowed cross-origin request)
        self.started = False
        self.status = 0
        self.content_type = ""
        self.body_bytes = 0

    @property
    def closed(self) -> bool:
        return self._transport.is_closing()

    def start(self, status: int, content_type: str, extra: dict[str, str] | None = None,
              length: int | None = None) -> None:
        if self.started:
            raise RuntimeError("the response has already started")
        self.started, self.status, self.content_type = True, status, content_type
        headers = {**common_headers(content_type), **self._headers, **(extra or {})}
        if status == 204:  # no content: no body headers (RFC 9110)
            headers.pop("Content-Type")
            length = None
        if length is not None:
            headers["Content-Length"] = str(length)
        phrase = http.HTTPStatus(status).phrase
        head = f"HTTP/1.1 {status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self._write(head.encode("latin-1"))

    def write(self, data: bytes) -> None:
        if not self._head_only:
            self.body_bytes += len(data)
            self._write(data)

    def send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.start(status, content_type, extra, length=len(body))
        self.write(body)

    def send_json(self, status: int, obj: Any, extra: dict[str, str] | None = None) -> None:
        self.send(status, json.dumps(obj).encode(), "application/json", extra)

    def fail(self, status: int, code: str, message: str, param: str | None = None) -> None:
        """Report an error however far the response got: the error response if nothing was sent yet; an error
        event (which the OpenAI SDK raises as an APIError) in a started event stream; nothing otherwise (the
        client sees a body shorter than its Content-Length)."""
        if self.closed:
            return
        if not self.started:
            # capacity and shutdown refusals are worth retrying soon (the OpenAI SDK waits as told, then retries)
            extra = {"Retry-After": "1"} if status in (429, 503) else None
            self.send_json(status, error_body(status, code, message, param), extra)
        elif self.content_type.startswith(EVENT_STREAM):
            self.write(b"data: " + json.dumps(error_body(status, code, message, param)).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)


HttpHandler = Callable[[HttpRequest, HttpReply, "HttpAwareConnection"], Awaitable[None]]
# called with the request's head (no body yet): an HttpError refuses the request before its body is read
HeadCheck = Callable[[HttpRequest, "HttpAwareConnection"], "HttpError | None"]
CLOSE_FLUSH_S = 30.0  # how long a finished reply may take to drain to a slow client before the connection is cut
LINGER_S, LINGER_IDLE_S = 2.0, 0.5  # after an early error, how long the rest of a body is read and dropped
# a request body must arrive within BODY_GRACE_S plus its size at MIN_BODY_RATE (bytes/s, 128 kbit/s): a client that
# drips its body a byte at a time would otherwise hold its buffered megabytes, and its upload slot, indefinitely
BODY_GRACE_S, MIN_BODY_RATE = 30.0, 16 * 1024


class HttpAwareConnection(ServerConnection):
    """See the module docstring. Made by `serve(create_connection=...)` through `connection_factory`."""

    def __init__(self, *args: Any, http_handler: HttpHandler, head_check: HeadCheck, max_body_bytes: int,
                 open_timeout: float, read_timeout: float, registry: set[HttpAwareConnection] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._registry = registry  # the server's open connections, for its shutdown (`abort_read`)
        if registry is not None:
            registry.add(self)
        self._http_handler = http_handler
        self._head_check = head_check
        self._head_checked = False
        self._more_data = asyncio.Event()  # bytes arrived while an early error's reply lingers
        self._open_timeout = open_timeout
        self._read_timeout = read_timeout
        self._mode: str | None = None  # None while sniffing, then "ws" or "http"
        self._sniffed = bytearray()
        self._mode_known: asyncio.Future[None] = self.loop.create_future()
        self._reader = HttpRequestReader(max_body_bytes)
        self._request_done: asyncio.Future[HttpRequest | None] = self.loop.create_future()
        self._continue_sent = False
        self._read_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None  # the whole body's deadline (BODY_GRACE_S, MIN_BODY_RATE)
        self.receiving_body = False  # the head passed its checks and the body is still arriving
        self.http_task: asyncio.Task[None] | None = None
        self.client_left = False  # the client closed the connection while its request ran
        self.response_headers: dict[str, str] = {}  # added to every response (set by the head check: CORS)

    # -- routing ------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._mode == "ws":
            super().data_received(data)
            return
        if self._mode == "http":
            self._http_data(data)
            return
        self._sniffed += data
        space = self._sniffed.find(b" ")
        if space < 0 and len(self._sniffed) < SNIFF_BYTES:
            return
        method = bytes(self._sniffed[:space]) if space >= 0 else b""
        buffered, self._sniffed = bytes(self._sniffed), bytearray()
        if method and method != b"GET" and method.isalpha() and method.isupper():
            self._mode = "http"
            self._set_mode_known()
            self._arm_read_timer()
            self._http_data(buffered)
        else:  # the websocket handshake, a GET route, or bytes websockets will refuse
            self._mode = "ws"
            self._set_mode_known()
            super().data_received(buffered)

    def eof_received(self) -> bool | None:
        if self._mode == "http":
            if not self._request_done.done():
                self._fail_read(HttpError(400, "bad_request", "the connection ended before the request was complete"))
                return True  # keep our write side open for that reply
            # the client closed its side after its request: it left (as Go's net/http reads it, since HTTP/1.1
            # clients do not half-close while waiting for a reply), so its work is stopped, or never started
            self.client_left = True
            if self.http_task is not None and not self.http_task.done():
                self.http_task.cancel()
            return True
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._registry is not None:
            self._registry.discard(self)
        self._reading_ended()
        if not self._mode_known.done():
            self._mode_known.set_result(None)
        if not self._request_done.done():
            self._request_done.set_result(None)
        if self.http_task is not None and not self.http_task.done():
            self.client_left = True
            self.http_task.cancel()  # the client left: stop its work (an engine stream is closed on cancellation)
        super().connection_lost(exc)

    async def handshake(self, *args: Any, **kwargs: Any) -> None:
        try:
            async with asyncio.timeout(self._open_timeout):
                await asyncio.shield(self._mode_known)
        except TimeoutError:
            self.transport.abort()
            raise
        if self._mode != "http":
            async with asyncio.timeout(self._open_timeout):
                await super().handshake(*args, **kwargs)
            return
        request = await self._request_done
        reply = HttpReply(self.transport, head_only=request is not None and request.method in ("HEAD", "OPTIONS"),
                          headers=self.response_headers)
        if request is not None and not self.client_left:
            task = asyncio.current_task()
            self.http_task = task
            try:
                await self._http_handler(request, reply, self)
            except asyncio.CancelledError:  # the client left, or the server is stopping (`abort_http`)
                if task is not None:
                    task.uncancel()
                if not self.client_left:
                    reply.fail(503, "server_shutting_down", "The server stopped before the request was finished")
            except Exception:
                # the path only: a query may carry ?api_key=
                logger.exception("%s %s failed", request.method, request.target.partition("?")[0])
                reply.fail(500, "internal_error", "The server failed to process the request; see its log")
            finally:
                self.http_task = None
        elif self._reader.error is not None:
            err = self._reader.error
            reply.fail(err.status, err.code, err.message)
            await self._linger()
        self.transport.close()  # after the buffered reply is flushed
        try:
            await asyncio.wait_for(asyncio.shield(self.connection_lost_waiter), CLOSE_FLUSH_S)
        except TimeoutError:  # a client that stopped reading: its reply is dropped
            self.transport.abort()

    async def _linger(self) -> None:
        """Read and drop what the client still sends of a refused request's body for a moment before closing:
        closing with unread bytes makes the kernel reset the connection, and the client may lose our reply."""
        deadline = self.loop.time() + LINGER_S
        while not self.transport.is_closing() and not self._reader.done and self.loop.time() < deadline:
            self._more_data.clear()
            try:
                await asyncio.wait_for(self._more_data.wait(), LINGER_IDLE_S)
            except TimeoutError:
                return

    def abort_read(self, err: HttpError) -> None:
        """Server shutdown: a request still arriving is answered `err` if its head is in (a body in flight), and a
        connection that has sent no whole request yet is closed; a websocket or a request being served is left to
        the server's other shutdown steps. Without this, a client dripping its bytes held the shutdown open."""
        transport = getattr(self, "transport", None)  # none before the connection is made
        if self._mode == "http" and not self._request_done.done():
            if self._reader.head is not None:
                self._fail_read(err)
            elif transport is not None:
                transport.close()
        elif self._mode is None and transport is not None:
            transport.close()

    def abort_http(self) -> None:
        """Stop this connection's HTTP request now (server shutdown): it is answered 503 and closed."""
        if self.http_task is not None and not self.http_task.done():
            self.http_task.cancel()

    def _set_mode_known(self) -> None:
        if not self._mode_known.done():
            self._mode_known.set_result(None)

    # -- reading a request with a body --------------------------------------------------------------
    def _http_data(self, data: bytes) -> None:
        if self._request_done.done():  # an early error's lingering read: the body's end tells when to close
            self._more_data.set()
            try:
                self._reader.feed(data)
            except HttpError:
                pass
            return
        if self._reader.head is not None:  # the body's bytes each restart the idle timer; the head's do not: it
            self._arm_read_timer()          # must arrive whole within one read timeout (a byte-drip held it open)
        try:
            request = self._reader.feed(data)
        except HttpError as err:
            self._fail_read(err)
            return
        except Exception:  # a parser bug: this request gets a 400 and the connection closes, the server goes on
            logger.exception("HTTP request parsing failed")
            self._fail_read(HttpError(400, "bad_request", "the request could not be parsed"))
            return
        if self._reader.head is not None and not self._head_checked:
            self._head_checked = True
            err = self._head_check(self._reader.head, self)
            if err is not None:
                self._fail_read(err)
                return
            if request is None:  # a body to wait for: at the least rate a client may send it (a drip holds memory)
                self.receiving_body = True
                self._body_timer = self.loop.call_later(self._body_deadline(self._reader.head), self._body_too_slow)
        if self._reader.expects_continue and not self._continue_sent and request is None:
            self._continue_sent = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if request is not None:
            self._reading_ended()
            self._request_done.set_result(request)

    def _body_deadline(self, head: HttpRequest) -> float:
        length = head.header("content-length")
        size = int(length) if length is not None and length.strip().isascii() and length.strip().isdigit() else (
            self._reader.max_body_bytes)
        return BODY_GRACE_S + size / MIN_BODY_RATE

    def _body_too_slow(self) -> None:
        self._body_timer = None
        self._fail_read(HttpError(408, "request_timeout", f"the request body arrived slower than "
                                  f"{MIN_BODY_RATE // 1024} KB/s on average (after {BODY_GRACE_S:g} s of grace)"))

    def _fail_read(self, err: HttpError) -> None:
        self._reading_ended()
        self._reader.error = err
        if not self._request_done.done():
            self._request_done.set_result(None)

    def _arm_read_timer(self) -> None:
        self._cancel_read_timer()
        self._read_timer = self.loop.call_later(self._read_timeout, self._read_timed_out)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _reading_ended(self) -> None:
        """The request's reading ended (complete, failed or timed out): its timers stop."""
        self._cancel_read_timer()
        self.receiving_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        self._fail_read(HttpError(408, "request_timeout", f"no request bytes for {self._read_timeout:g} s"))


def connection_factory(http_handler: HttpHandler, head_check: HeadCheck, *, max_body_bytes: int,
                       open_timeout: float, read_timeout: float, registry: set[HttpAwareConnection] | None = None
                       ) -> Callable[..., HttpAwareConnection]:
    """`create_connection` for websockets' `serve`: its connections also route HTTP uploads to `http_handler`; each
    open one is in `registry` (given)."""

    def create(*args: Any, **kwargs: Any) -> HttpAwareConnection:
        return HttpAwareConnection(*args, http_handler=http_handler, head_check=head_check,
                                   max_body_bytes=max_body_bytes, open_timeout=open_timeout,
                                   read_timeout=read_timeout, registry=registry, **kwargs)

    return create
