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


def session_too_long(out_audio_end_ms: int, then: str) -> ProtocolError:
    """The error both dialects send when the engine ended a stream at its maximum session length; `then` says what
    happens to the audio after its end in this dialect."""
    return ProtocolError(
        "session_too_long", f"This utterance reached the server's maximum length (--max-session-seconds): its "
        f"transcript ends at {out_audio_end_ms} ms. {then}")


def new_id(prefix: str, nbytes: int = 12) -> str:
    return f"{prefix}{secrets.token_hex(nbytes)}"


UNPAIRED_SURROGATE = "a string holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff), which is not text"


def has_unpaired_surrogate(value: Any) -> bool:
    """Whether a string in `value` (parsed JSON) holds an unpaired UTF-16 surrogate: JSON's `\\ud800` escapes spell
    one and `json.loads` accepts it, but it is no Unicode text, so no UTF-8 frame can carry it back."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def unsendable(value: Any) -> str | None:
    """Why `value` could not go back to a client as JSON text (NaN and Infinity are not JSON; an unpaired surrogate,
    as `has_unpaired_surrogate`), or None if it could. Checked before a client's value is stored to be echoed: a
    reply that cannot be sent must not be found out only when it is sent."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return "NaN and Infinity are not JSON values"
    except RecursionError:
        return "it is nested too deeply"
    return UNPAIRED_SURROGATE if has_unpaired_surrogate(value) else None


def dumps(event: dict[str, Any]) -> str:
    """Compact JSON in insertion order, UTF-8 text unescaped (as pydantic's model_dump_json writes it). A string
    with an unpaired surrogate, which UTF-8 cannot carry, is written with `\\u` escapes instead (`unsendable`
    keeps client values out; this keeps any other from ending the session when its frame is encoded)."""
    text = json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = json.dumps(event, separators=(",", ":"), allow_nan=False)
    return text
