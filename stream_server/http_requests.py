"""HTTP/1.1 requests with a body (POST), read incrementally from a socket's bytes.

websockets answers only GET requests without a body, so requests such as a file upload to
`/v1/audio/transcriptions` are read here instead (`http_connection.py` routes them). The reader is
sans-I/O: `feed(bytes)` until it returns the complete request. Bodies come with `Content-Length` or
`Transfer-Encoding: chunked`; both are bounded (`max_body_bytes`), and so is the head. Anything
malformed raises `HttpError` with the status and a message to send back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_HEAD_BYTES = 32 << 10
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class HttpError(Exception):
    """A request that gets an error response: `status`, an error `code` and a message for the client."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class HttpRequest:
    method: str
    target: str  # path and query, as sent
    version: str
    headers: list[tuple[str, str]]  # names lower-cased, in order
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The first value of header `name` (case-insensitive), or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def header_values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]


@dataclass
class HttpRequestReader:
    """Feed bytes with `feed`; it returns the request once its body is complete (then the reader is done).

    `expects_continue` turns true once a head with `Expect: 100-continue` was read: the caller should
    then send `100 Continue` so that the client sends its body (curl waits a second otherwise)."""

    max_body_bytes: int
    _buf: bytearray = field(default_factory=bytearray)
    _request: HttpRequest | None = None
    _length: int | None = None  # Content-Length, or None for chunked
    _chunks: bytearray = field(default_factory=bytearray)
    _chunk_left: int = -1  # bytes left of the current chunk (+2 for its CRLF); -1: expecting a size line
    _trailers: bool = False
    done: bool = False
    expects_continue: bool = False
    error: HttpError | None = None  # why reading stopped, when it failed (set by the connection)

    @property
    def head(self) -> HttpRequest | None:
        """The request line and headers, once read (the body may still be arriving)."""
        return self._request

    def feed(self, data: bytes) -> HttpRequest | None:
        if self.done:
            return None  # bytes after the request (pipelining) are not served: the response closes the connection
        self._buf += data
        if self._request is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise HttpError(431, "headers_too_large", f"the request head exceeds {MAX_HEAD_BYTES} bytes")
                return None
            if end > MAX_HEAD_BYTES:
                raise HttpError(431, "headers_too_large", f"the request head exceeds {MAX_HEAD_BYTES} bytes")
            self._request = _parse_head(bytes(self._buf[:end]))
            del self._buf[: end + 4]
            self._length = self._body_length(self._request)
            self.expects_continue = (self._request.header("expect") or "").lower() == "100-continue"
        return self._read_body()

    def _body_length(self, req: HttpRequest) -> int | None:
        te = [v.strip().lower() for value in req.header_values("transfer-encoding") for v in value.split(",")]
        lengths = req.header_values("content-length")
        if te:
            if te != ["chunked"]:
                raise HttpError(501, "unsupported_transfer_encoding", f"transfer encoding {', '.join(te)} is not "
                                "supported (send Content-Length or chunked)")
            if lengths:
                raise HttpError(400, "bad_request", "a request may not carry both Content-Length and "
                                "Transfer-Encoding")
            return None
        if not lengths:
            return 0
        value = lengths[0].strip()
        # isdigit() alone takes digits that int() refuses (superscripts such as '\xb2' in a latin-1 header)
        if len(set(lengths)) != 1 or not (value.isascii() and value.isdigit()):
            raise HttpError(400, "bad_request", f"invalid Content-Length {', '.join(lengths)!r}")
        n = int(value)
        if n > self.max_body_bytes:
            raise HttpError(413, "request_too_large", _too_large(self.max_body_bytes))
        return n

    def _read_body(self) -> HttpRequest | None:
        assert self._request is not None
        if self._length is not None:
            if len(self._buf) < self._length:
                return None
            self._request.body = bytes(self._buf[: self._length])
            return self._finish()
        while True:  # chunked
            if self._trailers:  # trailer fields until an empty line; read and ignored, as RFC 9112 allows
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > MAX_HEAD_BYTES:
                        raise HttpError(431, "headers_too_large", "the request's trailer section is too large")
                    return None
                line = bytes(self._buf[:end])
                del self._buf[: end + 2]
                if not line:
                    self._request.body = bytes(self._chunks)
                    return self._finish()
                continue
            if self._chunk_left < 0:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > 1024:
                        raise HttpError(400, "bad_request", "a chunk size line is too long")
                    return None
                size_text = bytes(self._buf[:end]).split(b";", 1)[0].strip()
                del self._buf[: end + 2]
                # hex digits only: int(x, 16) would also take a sign, underscores and surrounding spaces
                if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                    raise HttpError(400, "bad_request", f"invalid chunk size {size_text[:32]!r}")
                size = int(size_text, 16)
                if size == 0:
                    self._trailers = True
                    continue
                if len(self._chunks) + size > self.max_body_bytes:
                    raise HttpError(413, "request_too_large", _too_large(self.max_body_bytes))
                self._chunk_left = size + 2
            if len(self._buf) < self._chunk_left:
                return None
            data = self._buf[: self._chunk_left]
            if data[-2:] != b"\r\n":
                raise HttpError(400, "bad_request", "a chunk does not end with CRLF")
            self._chunks += data[:-2]
            del self._buf[: self._chunk_left]
            self._chunk_left = -1

    def _finish(self) -> HttpRequest:
        self.done = True
        self._buf = bytearray()
        self._chunks = bytearray()
        assert self._request is not None
        return self._request


def _too_large(limit: int) -> str:
    return f"the request body exceeds the server's limit of {limit / (1 << 20):g} MiB (--max-upload-mb)"


def _parse_head(raw: bytes) -> HttpRequest:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1] or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HttpError(400, "bad_request", f"invalid HTTP request line {lines[0][:80]!r}")
    try:
        method, target, version = (p.decode("ascii") for p in parts)
    except UnicodeDecodeError:
        raise HttpError(400, "bad_request", "the request line must be ASCII") from None
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise HttpError(400, "bad_request", f"invalid header line {line[:80]!r}")
        headers.append((name.decode("ascii").lower(), value.strip().decode("latin-1")))
    return HttpRequest(method, target, version, headers)
