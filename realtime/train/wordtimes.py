"""Helpers shared by the engines: resampling to 16 kHz, silence trimming and engine-word -> input-word
mapping."""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.signal import firwin, resample_poly

from .targets import TimedWord

OUT_RATE = 16000
_FRAME_S = 0.010
_SILENCE_DB = -40.0


@functools.lru_cache(maxsize=8)
def _lowpass(up: int, down: int) -> np.ndarray:
    # resample_poly's own default design, computed once per ratio instead of on every call
    m = max(up, down)
    return firwin(2 * 10 * m + 1, 1.0 / m, window=("kaiser", 5.0))


def to_16k(audio: np.ndarray, rate: int) -> np.ndarray:
    """Mono float32 audio at `rate` -> float32 at 16 kHz (polyphase; unchanged when already 16 kHz).

    Not `realtime.audio.resample`: that one is the service's chunk-exact streaming resampler, and on whole
    utterances it is ~40x slower (22.05 -> 16 kHz, 5 s: 122 ms against 2.8 ms here), which synthesis
    throughput cannot afford; this keeps earlier shards' audio bit-identical too."""
    if rate == OUT_RATE:
        return audio.astype(np.float32, copy=False)
    g = math.gcd(rate, OUT_RATE)
    up, down = OUT_RATE // g, rate // g
    return resample_poly(audio, up, down, window=_lowpass(up, down)).astype(np.float32)


def _frame_db(audio: np.ndarray, rate: int) -> np.ndarray:
    n = int(rate * _FRAME_S)
    frames = audio[: audio.size // n * n].reshape(-1, n).astype(np.float64)
    rms = np.sqrt((frames ** 2).mean(axis=1) + 1e-12)
    return 20 * np.log10(rms / max(rms.max(), 1e-9))


def trim_word_ends(audio: np.ndarray, rate: int, words: list[str], spans: list[tuple[float, float]]
                   ) -> list[TimedWord]:
    """Move each word's end back over trailing silence (10 ms frames below -40 dB of the loudest)."""
    db = _frame_db(audio, rate)
    out: list[TimedWord] = []
    for w, (s, e) in zip(words, spans):
        lo, hi = int(s / _FRAME_S), int(np.ceil(e / _FRAME_S))
        hi = min(hi, db.size)
        while hi > lo + 1 and db[hi - 1] < _SILENCE_DB:
            hi -= 1
        out.append(TimedWord(w, s, max(s, min(e, hi * _FRAME_S))))
    return out


def _squash(s: str) -> str:
    return "".join(c for c in s.lower() if c.isalnum())


def map_engine_words(words: list[str], engine: list[tuple[str, float, float]]) -> list[TimedWord] | None:
    """Times of the input words from the engine's own word list (which may split, join or drop
    apostrophes): both are reduced to letters and digits and matched by character offset; an input
    word spans from the engine word holding its first character to the one holding its last.
    Returns None when the two spell different letters (the utterance is then skipped)."""
    target = "".join(_squash(w) for w in words)
    chars: list[int] = []  # engine word index of every squashed character
    for i, (w, _, _) in enumerate(engine):
        chars.extend([i] * len(_squash(w)))
    if "".join(_squash(w) for w, _, _ in engine) != target:
        return None
    out: list[TimedWord] = []
    pos = 0
    for w in words:
        n = len(_squash(w))
        if n == 0:
            return None
        first, last = chars[pos], chars[pos + n - 1]
        out.append(TimedWord(w, engine[first][1], engine[last][2]))
        pos += n
    return out
