"""Plain HTTP GET on the websocket port: the demo page, /health, /v1/models, /metrics (uploads: `transcriptions.py`).

These are answered from websockets' `process_request` hook, before any websocket handshake.
"""

from __future__ import annotations

import asyncio
import email.utils
import http
import json
import mimetypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

from websockets.datastructures import Headers
from websockets.http11 import Response

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".wav": "audio/wav",
    ".flac": "audio/flac",
    ".wasm": "application/wasm",
    ".txt": "text/plain; charset=utf-8",
}
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_STATIC_BYTES = 64 << 20


def common_headers(content_type: str) -> dict[str, str]:
    """The headers of every HTTP response on this port (GET routes here, uploads in `http_connection.py`)."""
    return {"Date": email.utils.formatdate(usegmt=True), "Connection": "close", "Content-Type": content_type,
            "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape, {"error": {"message", "type", "param", "code"}}, so its SDK raises the matching error."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def response(status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> Response:
    st = http.HTTPStatus(status)
    headers = Headers({**common_headers(content_type), "Content-Length": str(len(body))}.items())
    for k, v in (extra or {}).items():
        headers[k] = v
    return Response(st.value, st.phrase, headers, body)


def json_response(status: int, obj: Any, extra: dict[str, str] | None = None) -> Response:
    return response(status, json.dumps(obj).encode(), "application/json", extra)


def error_response(status: int, code: str, message: str, extra: dict[str, str] | None = None) -> Response:
    return json_response(status, error_body(status, code, message), extra)


def content_type_for(path: Path) -> str:
    return CONTENT_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def resolve_static(demo_dir: Path, url_path: str) -> Path | None:
    """The file under `demo_dir` that `url_path` names, or None (also for anything outside it)."""
    rel = url_path.lstrip("/") or "index.html"
    root = demo_dir.resolve()
    try:
        target = (root / rel).resolve()
    except (OSError, ValueError):
        return None
    if target != root and root not in target.parents:
        return None  # ../ escapes and absolute paths
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


async def static_file(demo_dir: Path, url_path: str) -> Response:
    target = resolve_static(demo_dir, url_path)
    if target is None:
        return error_response(404, "not_found", f"{url_path} not found")

    def read() -> bytes | None:
        return target.read_bytes() if target.stat().st_size <= MAX_STATIC_BYTES else None

    body = await asyncio.to_thread(read)
    if body is None:
        return error_response(413, "too_large", f"{url_path} is too large to serve")
    return response(200, body, content_type_for(target), {"Cache-Control": "no-cache"})


class HttpRoutes:
    """GET routes. `authorized` tells whether the request carried a valid key (or auth is off)."""

    def __init__(self, *, demo_dir: Path, served_model_names: tuple[str, ...], created: int,
                 health: Callable[[], dict[str, Any]], metrics_text: Callable[[], str]) -> None:
        self.demo_dir = demo_dir
        self.names = served_model_names
        self.created = created
        self.health = health
        self.metrics_text = metrics_text

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "streamscribe"}

    async def handle(self, path: str, *, authorized: bool) -> Response:
        if path == "/health":
            info = self.health()
            return json_response(200 if info.get("status") == "ok" else 503, info)
        if path == "/metrics":
            return response(200, self.metrics_text().encode(), PROMETHEUS_CONTENT_TYPE)
        if path == "/v1/models" or path.startswith("/v1/models/"):
            if not authorized:  # as OpenAI's API: listing models needs a key
                return error_response(401, "invalid_api_key", "Missing or invalid API key",
                                      {"WWW-Authenticate": "Bearer"})
            if path == "/v1/models":
                return json_response(200, {"object": "list", "data": [self._model(n) for n in self.names]})
            name = path[len("/v1/models/"):]  # ids may hold slashes (org/model)
            if name not in self.names:
                return error_response(404, "model_not_found", f"The model `{name}` does not exist (served: "
                                      f"{', '.join(self.names)})")
            return json_response(200, self._model(name))
        if path == "/v1/audio/transcriptions":  # read by the connection itself (http_connection.py); POST only
            return error_response(405, "method_not_allowed", f"{path} takes POST (a multipart file upload)",
                                  {"Allow": "POST"})
        if path.startswith("/v1/"):
            return error_response(404, "not_found", f"{path} not found")
        return await static_file(self.demo_dir, path)
