"""API keys and the browser Origin check for the websocket handshake.

Keys may come (first match wins) from `Authorization: Bearer KEY`, from `?api_key=KEY` or from a
`Sec-WebSocket-Protocol` entry `openai-insecure-api-key.KEY` (browsers cannot set headers on a
WebSocket; OpenAI's browser clients use that subprotocol). Keys are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from urllib.parse import parse_qs, urlsplit

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback_host(host: str) -> bool:
    h = host.strip().strip("[]").lower()
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def offered_subprotocols(header_values: list[str]) -> list[str]:
    out: list[str] = []
    for value in header_values:
        out.extend(p.strip() for p in value.split(",") if p.strip())
    return out


def extract_api_key(authorization: str | None, path: str, subprotocols: list[str]) -> str | None:
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    query = parse_qs(urlsplit(path).query)
    if query.get("api_key") and query["api_key"][0]:
        return query["api_key"][0]
    for proto in subprotocols:
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX) and len(proto) > len(KEY_SUBPROTOCOL_PREFIX):
            return proto[len(KEY_SUBPROTOCOL_PREFIX):]
    return None


def key_index(provided: str | None, keys: tuple[str, ...]) -> int | None:
    """Which configured key `provided` is (its index), checked in constant time against every key (digests hide
    the length); None when it is none of them. The index names a key in logs and quotas without revealing it."""
    if provided is None:
        return None
    digest = hashlib.sha256(provided.encode("utf-8", "surrogatepass")).digest()
    found = None
    for i, k in enumerate(keys):
        if hmac.compare_digest(digest, hashlib.sha256(k.encode("utf-8")).digest()):
            found = i
    return found


def key_matches(provided: str | None, keys: tuple[str, ...]) -> bool:
    return key_index(provided, keys) is not None


def _origin_parts(origin: str) -> tuple[str, str, int | None] | None:
    try:
        u = urlsplit(origin.strip())
        port = u.port
    except ValueError:
        return None
    if not u.scheme or not u.hostname:
        return None
    return u.scheme.lower(), u.hostname.lower(), port


def _is_ip_or_loopback(host: str) -> bool:
    if is_loopback_host(host):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def origin_allowed(origin: str | None, host_header: str | None, allowed: tuple[str, ...] | None, *,
                   auth_enabled: bool) -> bool:
    """Browsers send Origin; other clients usually do not (and are not subject to CSRF).

    Always allowed: no Origin, or an Origin on the host the request was sent to (our own demo
    page). With `allowed` None (the default) any localhost origin is allowed too; otherwise the
    listed origins are (exact `scheme://host[:port]`, or `*` for any).

    DNS rebinding: a hostile page can make its own host name resolve to this server, so that its
    Origin matches the Host header. Without API keys, "same host" therefore counts only for IP
    literals and localhost names; with keys the attacker would still need a key.
    """
    if origin is None:
        return True
    if allowed is not None and "*" in allowed:
        return True
    parts = _origin_parts(origin)
    if parts is None:  # "null" (file:// pages, sandboxed frames) and garbage
        return False
    scheme, host, port = parts
    if host_header:
        try:
            h = urlsplit("//" + host_header.strip())
            h_name, h_port = (h.hostname or "").lower(), h.port
        except ValueError:
            h_name, h_port = "", None
        effective = port if port is not None else _DEFAULT_PORTS.get(scheme)
        # a Host without a port (e.g. behind a TLS proxy) matches the origin's host on any port
        if h_name == host and (h_port is None or h_port == effective) and (
                auth_enabled or _is_ip_or_loopback(host)):
            return True
    if allowed is None:
        return is_loopback_host(host)
    normalized = origin.strip().rstrip("/").lower()
    return any(normalized == a.strip().rstrip("/").lower() for a in allowed)
