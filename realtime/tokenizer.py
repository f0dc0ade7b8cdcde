"""Tokenizers behind one interface, and incremental detokenisation into text deltas.

Two backends: `tekken.json` through mistral-common, `tokenizer.json` through the `tokenizers`
library. Both expose the raw bytes of each token, so text deltas are assembled from bytes: a
multi-byte character split across tokens is held back until it is complete, leading spaces are
kept, and control tokens (ids below `num_control_tokens`) never produce text.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)


class TokenizerError(ValueError):
    """A tokenizer file is missing, unreadable or inconsistent with the model."""


class TextTokenizer(Protocol):
    vocab_size: int
    num_control_tokens: int

    def token_bytes(self, token_id: int) -> bytes: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def _decode_bytes(tok: TextTokenizer, ids: list[int]) -> str:
    return b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", errors="replace")


class TekkenTokenizer:
    """`tekken.json` via mistral-common's Tekkenizer."""

    def __init__(self, path: Path) -> None:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        try:
            self._tok = Tekkenizer.from_file(path)
        except Exception as exc:  # mistral-common raises assertions and ValueErrors
            raise TokenizerError(f"{path}: cannot read tekken tokenizer: {exc!r}") from exc
        self._ignore = SpecialTokenPolicy.IGNORE
        self.vocab_size: int = self._tok.n_words
        self.num_control_tokens: int = self._tok.num_special_tokens
        self.path = path

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} outside the vocabulary (size {self.vocab_size})")
        if token_id < self.num_control_tokens:
            return b""
        return self._tok.id_to_byte_piece(token_id, self._ignore)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, bos=False, eos=False)

    def decode(self, ids: list[int]) -> str:
        return _decode_bytes(self, ids)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table used by ByteLevel BPE tokenizers."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class HFTokenizer:
    """`tokenizer.json` via the `tokenizers` library (ByteLevel or Metaspace/byte-fallback models)."""

    def __init__(self, path: Path, num_control_tokens: int) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise TokenizerError(f"{path}: cannot read tokenizer.json: {exc}") from exc
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.num_control_tokens = num_control_tokens
        self.path = path
        spec = json.loads(path.read_text(encoding="utf-8"))
        dec = spec.get("decoder") or {}
        kinds = {dec.get("type")} | {d.get("type") for d in dec.get("decoders", []) if isinstance(d, dict)}
        self._byte_level = "ByteLevel" in kinds
        self._special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        self._unicode_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
        self._cache: dict[int, bytes] = {}

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} outside the vocabulary (size {self.vocab_size})")
        if token_id < self.num_control_tokens or token_id in self._special:
            return b""
        cached = self._cache.get(token_id)
        if cached is not None:
            return cached
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            out = b""
        elif self._byte_level:
            out = bytes(self._unicode_to_byte[c] for c in piece)
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            out = bytes([int(piece[3:5], 16)])  # sentencepiece-style byte fallback
        else:
            out = piece.replace("\u2581", " ").encode("utf-8")
        self._cache[token_id] = out
        return out

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return _decode_bytes(self, ids)


def load_tokenizer(model_dir: str | Path, num_control_tokens: int = 1000) -> TextTokenizer:
    """`tekken.json` if present (the published layout), otherwise `tokenizer.json`."""
    d = Path(model_dir)
    if (d / "tekken.json").exists():
        return TekkenTokenizer(d / "tekken.json")
    if (d / "tokenizer.json").exists():
        return HFTokenizer(d / "tokenizer.json", num_control_tokens)
    raise TokenizerError(f"{d} holds neither tekken.json nor tokenizer.json")


@dataclass
class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas; never splits a UTF-8 character."""

    tokenizer: TextTokenizer
    # (delta, bytes held back) of a token pushed with nothing pending: that is nearly every push, and it depends on
    # the token alone, so its byte work runs once a token id. Bounded by the vocabulary; share one dict among the
    # detokenisers of one tokenizer on one thread (the engine does), so that it is built once, not once a stream.
    text_cache: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    _pending: bytes = b""
    _parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """Everything pushed so far, as text."""
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def push(self, token_id: int) -> str:
        if self._pending:
            delta, self._pending = _split_complete(self._pending + self.tokenizer.token_bytes(token_id))
        else:
            hit = self.text_cache.get(token_id)
            if hit is None:
                hit = self.text_cache[token_id] = _split_complete(self.tokenizer.token_bytes(token_id))
            delta, self._pending = hit
        if delta:
            self._append(delta)
        return delta

    def flush(self) -> str:
        """End of stream: bytes still pending are invalid UTF-8; emit them as U+FFFD."""
        if not self._pending:
            return ""
        delta = self._pending.decode("utf-8", errors="replace")
        self._pending = b""
        self._append(delta)
        return delta

    def _append(self, delta: str) -> None:
        # Deltas are kept as parts, joined every PARTS_JOINED of them: appending to one string copied the whole
        # transcript at every text token (quadratic over a long stream), and keeping every part would cost a str
        # object (about 50 bytes) per word of a 3-hour stream.
        self._parts.append(delta)
        if len(self._parts) > PARTS_JOINED:
            self._parts[:] = ["".join(self._parts)]


PARTS_JOINED = 64


def _split_complete(data: bytes) -> tuple[str, bytes]:
    """(the text of data's complete characters, the bytes of an unfinished one at its end)."""
    cut = _complete_utf8_prefix(data)
    return data[:cut].decode("utf-8", errors="replace"), data[cut:]


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix that does not end inside a (possibly valid) multi-byte char."""
    n = len(data)
    # look back at most 3 bytes for the start of an unfinished sequence
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0b1100_0000 == 0b1000_0000:
            continue  # continuation byte: keep looking for the lead byte
        if b & 0b1000_0000 == 0:
            return n  # ASCII: everything complete
        need = 2 if b & 0b1110_0000 == 0b1100_0000 else 3 if b & 0b1111_0000 == 0b1110_0000 else \
            4 if b & 0b1111_1000 == 0b1111_0000 else 1
        return n if back >= need else n - back
    return n  # only continuation bytes (invalid): let the decoder replace them
