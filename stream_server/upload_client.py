"""A client of `POST /v1/audio/transcriptions` on the standard library alone: the command-line client's `--upload`
and `benchmarks/bench_http_transcribe.py` use it (the OpenAI SDK and curl work too).

`upload_file` sends a file as multipart/form-data and returns the transcript; with `stream=True` it reads the
server-sent events as they come and hands each to `on_event`.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"


class UploadError(RuntimeError):
    """The server refused or failed the upload: its HTTP status and OpenAI-shaped error."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(f"{status} {code or ''}: {message}".replace(" :", ":"))
        self.status, self.code, self.message = status, code, message


@dataclass
class UploadResult:
    text: str
    seconds: float  # request sent -> transcript complete
    first_delta_s: float | None = None  # stream: request sent -> first text delta
    words: list[dict[str, Any]] = field(default_factory=list)  # stream: [{word, start_ms, end_ms}] (our extension)
    body: dict[str, Any] = field(default_factory=dict)  # the JSON response, or the done event when streaming


def http_base(url: str) -> str:
    """http(s)://HOST:PORT of a server named by any of its URLs (ws://, wss://, http://, https://, a path or not)."""
    u = urlsplit(url if "://" in url else f"http://{url}")
    scheme = {"ws": "http", "wss": "https", "http": "http", "https": "https"}.get(u.scheme)
    if scheme is None or not u.hostname:
        raise ValueError(f"not a server URL: {url!r} (use http://HOST:PORT or ws://HOST:PORT)")
    return f"{scheme}://{u.netloc}"


def multipart_form(fields: dict[str, str], file_name: str, data: bytes) -> tuple[str, bytes]:
    """(Content-Type, body) of a form with `fields` and the file."""
    boundary = uuid.uuid4().hex
    out = bytearray()
    for name, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    quoted = file_name.replace('"', "%22").replace("\r", "").replace("\n", "")
    out += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{quoted}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", bytes(out)


def upload_file(url: str, path: Path, *, model: str | None = None, api_key: str | None = None,
                response_format: str = "json", stream: bool = False, delay_ms: int | None = None,
                ca_file: str | None = None, timeout: float = 600.0,
                on_event: Callable[[dict[str, Any]], None] | None = None) -> UploadResult:
    """Transcribe `path` on the server at `url`; UploadError when the server answers an error (also one sent in the
    event stream), OSError when it cannot be reached."""
    base = urlsplit(http_base(url))
    fields = {"response_format": response_format, "stream": "true" if stream else "false"}
    if model:
        fields["model"] = model
    if delay_ms is not None:
        fields["transcription_delay_ms"] = str(delay_ms)
    ctype, body = multipart_form(fields, path.name, path.read_bytes())
    if base.scheme == "https":
        context = ssl.create_default_context(cafile=ca_file)
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(base.hostname, base.port, timeout=timeout,
                                                                       context=context)
    else:
        conn = http.client.HTTPConnection(base.hostname, base.port, timeout=timeout)
    headers = {"Content-Type": ctype}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.perf_counter()
    try:
        conn.request("POST", TRANSCRIPTIONS_PATH, body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise _error(resp.status, resp.read())
        if not stream:
            payload = resp.read()
            if response_format in ("json", "verbose_json"):
                data = json.loads(payload)
                return UploadResult(data["text"], time.perf_counter() - t0, body=data)
            return UploadResult(payload.decode(), time.perf_counter() - t0)
        return _read_events(resp, t0, on_event)
    finally:
        conn.close()


def _read_events(resp: http.client.HTTPResponse, t0: float,
                 on_event: Callable[[dict[str, Any]], None] | None) -> UploadResult:
    first: float | None = None
    data_lines: list[str] = []
    for raw in resp:  # server-sent events: "data: ..." lines, a blank line ends an event
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data:"):
            data_lines.append(line[5:].lstrip())
            continue
        if line or not data_lines:
            continue
        data, data_lines = "\n".join(data_lines), []
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            err = event["error"]
            raise UploadError(200, err.get("code"), err.get("message", "the server failed the upload"))
        if on_event is not None:
            on_event(event)
        if event.get("type") == "transcript.text.delta" and first is None:
            first = time.perf_counter() - t0
        elif event.get("type") == "transcript.text.done":
            return UploadResult(event["text"], time.perf_counter() - t0, first, event.get("words", []), event)
    raise UploadError(200, None, "the event stream ended before transcript.text.done")


def _error(status: int, payload: bytes) -> UploadError:
    try:
        err = json.loads(payload)["error"]
        return UploadError(status, err.get("code"), err.get("message", ""))
    except (ValueError, KeyError, TypeError):
        return UploadError(status, None, payload.decode(errors="replace")[:500])
