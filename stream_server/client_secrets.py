"""Ephemeral client secrets (`ek_...`): OpenAI's `POST /v1/realtime/client_secrets`.

A browser or mobile app must not hold the service's API key. Its backend asks for a short-lived secret with the
real key (`client.realtime.client_secrets.create(...)` in the OpenAI SDK) and hands that to the app, which opens
`/v1/realtime` with it: as the subprotocol `openai-insecure-api-key.ek_...`, or as `Authorization: Bearer
ek_...`. The secret opens realtime sessions only (not uploads, not `/v1/models`), until it expires. A session
configuration given with it becomes the starting configuration of every session it opens.

Secrets are stateless: the expiry, the issuing key's number and the session configuration, signed with HMAC-SHA256
under a key derived from the configured API keys. So every `--workers` process accepts what any of them issued,
and rotating the API keys voids every secret. Without API keys (auth off) secrets are still issued, for clients
written against OpenAI, but nothing needs them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from .events import ProtocolError, new_id
from .openai_dialect import OpenAIDialect, TranscriptionConfig, parse_session

PREFIX = "ek_"
DEFAULT_TTL_S, MIN_TTL_S, MAX_TTL_S = 600, 10, 7200  # OpenAI's: 10 minutes by default, 10 s to 2 hours
MAX_SECRET_CHARS = 4096  # the session configuration rides in the secret: keep header sizes sane


@dataclass(frozen=True)
class EphemeralGrant:
    key_index: int | None  # the API key that issued the secret (its index), None when auth was off
    expires_at: int  # unix seconds
    session: dict[str, Any] | None  # the starting configuration of the sessions it opens


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ClientSecrets:
    """Issues and checks ephemeral secrets for one set of API keys."""

    def __init__(self, api_keys: tuple[str, ...]) -> None:
        material = b"streamscribe client secrets\0" + "\0".join(api_keys).encode("utf-8")
        self._key = hashlib.sha256(material).digest()

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest()[:18])

    def issue(self, key_index: int | None, session: dict[str, Any] | None, expires_at: int) -> str:
        body = {"k": key_index, "x": expires_at, "s": session, "n": secrets.token_hex(6)}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode("utf-8"))
        value = f"{PREFIX}{payload}.{self._mac(payload)}"
        if len(value) > MAX_SECRET_CHARS:
            raise ValueError(f"the session configuration is too large for a client secret ({len(value)} characters)")
        return value

    def create(self, body: bytes, *, key_index: int | None, served: tuple[str, ...],
               default_delay_ms: int) -> dict[str, Any]:
        """`POST /v1/realtime/client_secrets`: {"expires_after": {"anchor", "seconds"}, "session": {...}} -> the
        secret, its expiry and the session it starts (OpenAI's shapes); ProtocolError (a 400) names the field at
        fault. `key_index`: the API key the request carried (None with auth off)."""
        try:
            req = json.loads(body or b"{}")
        except (ValueError, RecursionError):
            raise ProtocolError("invalid_json", "the body must be a JSON object") from None
        if not isinstance(req, dict):
            raise ProtocolError("invalid_json", "the body must be a JSON object")
        for name in req:
            if name not in ("expires_after", "session"):
                raise ProtocolError("unknown_parameter", f"unknown parameter {name!r}", param=name)
        after = req.get("expires_after") or {}
        seconds = after.get("seconds", DEFAULT_TTL_S) if isinstance(after, dict) else None
        if (not isinstance(after, dict) or after.get("anchor", "created_at") != "created_at"
                or isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_TTL_S <= seconds <= MAX_TTL_S):
            raise ProtocolError("invalid_value", f"expires_after must be {{\"anchor\": \"created_at\", \"seconds\": "
                                f"{MIN_TTL_S}..{MAX_TTL_S}}}", param="expires_after")
        cfg = TranscriptionConfig(model=served[0])
        session = req.get("session")
        if session is not None:
            cfg = parse_session(cfg, session, served)  # checked now, so that the app learns of a mistake here
        expires_at = int(time.time()) + seconds
        try:
            value = self.issue(key_index, session, expires_at)
        except ValueError as exc:
            raise ProtocolError("invalid_value", str(exc), param="session") from None
        started = OpenAIDialect.session_object(new_id("sess_"), cfg, default_delay_ms)
        return {"value": value, "expires_at": expires_at, "session": {**started, "expires_at": expires_at}}

    def verify(self, value: str | None, now: float) -> EphemeralGrant | None:
        """The grant of a valid, unexpired secret; None for anything else (forged, altered, expired, malformed)."""
        if not value or not value.startswith(PREFIX) or len(value) > MAX_SECRET_CHARS:
            return None
        payload, _, mac = value[len(PREFIX):].partition(".")
        if not payload or not (payload + mac).isascii():  # a real secret is base64 text; compare_digest needs ASCII
            return None
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            body = json.loads(_unb64(payload))
            grant = EphemeralGrant(body["k"], int(body["x"]), body["s"])
        except (ValueError, KeyError, TypeError):
            return None
        return grant if grant.expires_at > now else None


def is_ephemeral(key: str | None) -> bool:
    return bool(key) and key.startswith(PREFIX)  # type: ignore[union-attr]
