"""`multipart/form-data` bodies (RFC 7578), as the OpenAI SDK, curl -F and browsers send file uploads.

`parse_form(content_type, body)` returns every part in order. Part bodies are binary and are found by
searching for the boundary, never by splitting lines, so a 25 MB upload parses in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from email.utils import collapse_rfc2231_value

from .http_requests import HttpError


@dataclass(frozen=True)
class FormPart:
    name: str
    data: bytes
    filename: str | None = None  # set for file parts
    content_type: str | None = None

    def text(self) -> str:
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise HttpError(400, "invalid_value", f"form field {self.name!r} is not UTF-8 text") from None


MAX_PARAMS = 32  # parameters of one header value (a form part or the body's type uses two or three)
MAX_PARTS = 64  # form fields (a transcription request has about ten)


def _params(value: str) -> tuple[str, dict[str, str]]:
    """A header value's main value (lower-cased) and its parameters (unquoted; RFC 2231 forms decoded), parsed
    once: asking `email.message` for each parameter by name re-parses the whole value every time, so a few KB of
    parameters held the event loop for seconds."""
    if value.count(";") > MAX_PARAMS:
        raise HttpError(400, "bad_request", f"a header value has more than {MAX_PARAMS} parameters")
    msg = Message()
    msg["x"] = value
    params = msg.get_params(header="x") or []
    if not params:
        return "", {}
    values: dict[str, str] = {}
    for k, v in params[1:]:
        values.setdefault(k.lower(), collapse_rfc2231_value(v))  # type: ignore[arg-type]  # the first, as get_param
    return params[0][0].lower(), values


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a multipart/form-data Content-Type; HttpError 415 for any other body type."""
    main, params = _params(content_type or "")
    if main != "multipart/form-data":
        raise HttpError(415, "unsupported_media_type", f"the body must be multipart/form-data (a file upload), "
                        f"got {content_type or 'no Content-Type'}")
    boundary = params.get("boundary", "")
    if not boundary or len(boundary) > 200:
        raise HttpError(400, "bad_request", "multipart/form-data without a valid boundary parameter")
    return boundary.encode("latin-1")


def parse_form(content_type: str | None, body: bytes) -> list[FormPart]:
    boundary = boundary_of(content_type)
    delim = b"--" + boundary
    start = body.find(delim)
    if start < 0 or (start > 0 and body[start - 2: start] != b"\r\n"):
        raise HttpError(400, "bad_request", "the multipart body does not contain its boundary")
    parts: list[FormPart] = []
    pos = start + len(delim)
    while True:
        if body[pos: pos + 2] == b"--":
            return parts  # the closing delimiter (anything after it is an epilogue)
        line_end = body.find(b"\r\n", pos)
        if line_end < 0 or body[pos:line_end].strip(b" \t"):
            raise HttpError(400, "bad_request", "malformed multipart delimiter line")
        head_end = body.find(b"\r\n\r\n", line_end)
        if head_end < 0:
            raise HttpError(400, "bad_request", "a multipart part has no end of headers")
        headers = _part_headers(body[line_end + 2: head_end]) if head_end > line_end else {}
        data_start = head_end + 4
        nxt = body.find(b"\r\n" + delim, data_start)
        if nxt < 0:
            raise HttpError(400, "bad_request", "the multipart body ends before its closing boundary")
        disposition, params = _params(headers.get("content-disposition", ""))
        if disposition != "form-data" or not params.get("name"):
            raise HttpError(400, "bad_request", "a multipart part lacks Content-Disposition: form-data; name=...")
        if len(parts) == MAX_PARTS:
            raise HttpError(400, "bad_request", f"the form has more than {MAX_PARTS} fields")
        parts.append(FormPart(params["name"], body[data_start:nxt], params.get("filename"),
                              headers.get("content-type")))
        pos = nxt + 2 + len(delim)


def _part_headers(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in raw.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpError(400, "bad_request", f"invalid multipart header {line[:80]!r}")
        # browsers send file names as raw UTF-8 inside the quotes
        out[name.strip().decode("latin-1").lower()] = value.strip().decode("utf-8", "replace")
    return out
