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


def session_too_long(out_audio_end_ms: int) -> ProtocolError:
    """The error both dialects send when the engine ended a stream at its maximum session length."""
    return ProtocolError(
        "session_too_long", f"This utterance reached the server's maximum length (--max-session-seconds): its "
        f"transcript ends at {out_audio_end_ms} ms, and its audio after that which reached the server before this "
        "event was not transcribed. Audio appended from now on waits for a commit, which starts a new utterance")


def new_id(prefix: str, nbytes: int = 12) -> str:
    return f"{prefix}{secrets.token_hex(nbytes)}"


def dumps(event: dict[str, Any]) -> str:
    """Compact JSON in insertion order, UTF-8 text unescaped (as pydantic's model_dump_json writes it)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
