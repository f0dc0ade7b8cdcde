"""Plumbing shared by both dialects: ids, compact JSON, and the error a handler raises.

A handler raises `ProtocolError(code, message, param=...)` for anything a client did wrong; the
dialect renders it in its own error shape and the session goes on.
"""

from __future__ import annotations

import json
import secrets
from typing import Any


class ProtocolError(Exception):
    """A client mistake: reported as an `error` event; never closes the socket."""

    def __init__(self, code: str, message: str, *, param: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.detail = detail  # extra explanation where the message must stay exactly the reference's


def new_id(prefix: str, nbytes: int = 12) -> str:
    return f"{prefix}{secrets.token_hex(nbytes)}"


def dumps(event: dict[str, Any]) -> str:
    """Compact JSON in insertion order, UTF-8 text unescaped (as pydantic's model_dump_json writes it)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
