"""Wire audio decoders: base64, PCM16 and G.711 (µ-law / A-law) to float32 samples.

The G.711 tables follow ITU-T G.711 (the same expansion as the classic Sun/CCITT reference
code): every one of the 256 code words maps to a finite 16-bit value, so decoded audio can
never hold NaN or infinity whatever bytes a client sends.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np

from realtime.audio import AudioError, pcm16_to_float


def decode_base64(data: object, *, what: str = "audio") -> bytes:
    """Strict standard-alphabet base64 (the alphabet both dialects specify)."""
    if not isinstance(data, str):
        raise AudioError(f"{what} must be a base64 string, got {type(data).__name__}")
    try:
        # validate=True rejects characters outside the alphabet instead of skipping them, so
        # a corrupted payload is reported rather than silently decoded to other samples.
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioError(f"{what} is not valid base64: {exc}") from exc


def _ulaw_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32)
    u = ~codes & 0xFF
    sign = u & 0x80
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32)
    a = codes ^ 0x55
    sign = a & 0x80
    exponent = (a >> 4) & 0x07
    mantissa = a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(sign != 0, magnitude, -magnitude).astype(np.int16)


ULAW_TO_PCM16: np.ndarray = _ulaw_table()
ALAW_TO_PCM16: np.ndarray = _alaw_table()
_ULAW_FLOAT = ULAW_TO_PCM16.astype(np.float32) / 32768.0
_ALAW_FLOAT = ALAW_TO_PCM16.astype(np.float32) / 32768.0


def ulaw_to_float(data: bytes) -> np.ndarray:
    return _ULAW_FLOAT[np.frombuffer(data, dtype=np.uint8)]


def alaw_to_float(data: bytes) -> np.ndarray:
    return _ALAW_FLOAT[np.frombuffer(data, dtype=np.uint8)]


@dataclass(frozen=True)
class AudioFormat:
    """An input audio format: the codec name as the OpenAI dialect spells it, and its rate."""

    type: str  # "audio/pcm" | "audio/pcmu" | "audio/pcma"
    rate: int

    def decode(self, data: bytes) -> np.ndarray:
        """Raw payload bytes -> float32 samples at `self.rate` (AudioError on malformed input)."""
        if self.type == "audio/pcm":
            return pcm16_to_float(data)
        if self.type == "audio/pcmu":
            return ulaw_to_float(data)
        if self.type == "audio/pcma":
            return alaw_to_float(data)
        raise AudioError(f"unsupported audio format {self.type!r}")

    def to_json(self) -> dict[str, object]:
        # OpenAI's schema gives G.711 formats no rate field (they are always 8 kHz)
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}


PCM_RATES: tuple[int, ...] = (24000, 16000)  # 24 kHz is the OpenAI default; 16 kHz is the model's own rate
G711_RATE = 8000
PCM16_16K = AudioFormat("audio/pcm", 16000)
PCM16_24K = AudioFormat("audio/pcm", 24000)


def parse_openai_format(spec: object) -> AudioFormat:
    """`session.audio.input.format` -> AudioFormat; ValueError names what is wrong."""
    if not isinstance(spec, dict):
        raise ValueError("format must be an object like {\"type\": \"audio/pcm\", \"rate\": 24000}")
    kind = spec.get("type", "audio/pcm")
    if kind == "audio/pcm":
        rate = spec.get("rate", 24000)
        if isinstance(rate, bool) or not isinstance(rate, int) or rate not in PCM_RATES:
            supported = ", ".join(map(str, PCM_RATES))
            raise ValueError(f"rate {rate!r} is not supported for audio/pcm (supported: {supported})")
        return AudioFormat("audio/pcm", rate)
    if kind in ("audio/pcmu", "audio/pcma"):
        rate = spec.get("rate", G711_RATE)
        if rate != G711_RATE:
            raise ValueError(f"{kind} is 8000 Hz G.711; rate {rate!r} is not supported")
        return AudioFormat(kind, G711_RATE)
    raise ValueError(f"format type {kind!r} is not supported (supported: audio/pcm, audio/pcmu, audio/pcma)")
