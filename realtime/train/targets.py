"""Streaming training targets in the Voxtral-Realtime convention (see realtime/train/README.md).

One training example is one padded stream: `n_left` silent audio tokens, the user audio (whole
80 ms tokens), then `delay + 1 + buffer` silent tokens. Every position p carries audio token p and
an input token `ids[p]`; the network's output at p predicts `ids[p + 1]` (teacher forcing).

- `ids[0] = BOS`, `ids[1 .. n_left + delay] = [STREAMING_PAD]`: the prompt, identical to inference.
- A word whose audio ends at `end_s` (seconds of user audio) may be written once the model has
  heard `end + delay`: the input token of position q was decided having heard `(q - n_left) * 80 ms`
  of user audio, so the word is due at `q = n_left + ceil((end_ms + delay_ms) / 80)`.
- When nothing is being written, a due word opens an *emission group*: `[STREAMING_WORD]` at its
  due frame, then the text tokens of the word (each word is `" " + word`, Tekken style) in the
  following frames, one token per frame.
- Words that fall due while a group is still being written (words less than one frame apart, or
  a backlog of multi-token words) join that group: no marker of their own, their tokens simply
  follow. The next marker is written at the first due frame that finds the writer idle.
- Every other frame, including the whole right padding, is `[STREAMING_PAD]`. No EOS: a stream
  ends when its audio ends, as in the reference runtimes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config import ModelConfig


class TargetError(ValueError):
    """The words do not fit the stream (word times outside the audio, or no room to write them)."""


@dataclass(frozen=True)
class TimedWord:
    text: str
    start: float  # seconds from the start of the user audio
    end: float


@dataclass(frozen=True)
class StreamLayout:
    """Token counts of one padded training stream."""

    n_left: int
    n_user: int  # whole 80 ms tokens covering the user audio
    n_right: int  # delay + 1 + buffer
    delay_tokens: int

    @property
    def total(self) -> int:
        return self.n_left + self.n_user + self.n_right

    @property
    def prompt_len(self) -> int:
        return 1 + self.n_left + self.delay_tokens


def stream_layout(cfg: ModelConfig, n_samples: int, delay_tokens: int) -> StreamLayout:
    spt = cfg.samples_per_token
    return StreamLayout(cfg.streaming.n_left_pad_tokens, -(-n_samples // spt), cfg.right_pad_tokens(delay_tokens),
                        delay_tokens)


def due_frame(end_s: float, delay_tokens: int, n_left: int, token_ms: int = 80) -> int:
    """Position whose input token may first carry a word ending at `end_s` (see module doc)."""
    # round to whole microseconds first so 0.16 s (a float) is exactly two frames, not a hair more
    end_us = round(end_s * 1e6)
    return n_left + delay_tokens + max(1, math.ceil(end_us / (token_ms * 1000)))


def build_input_ids(cfg: ModelConfig, words: Sequence[TimedWord], word_tokens: Sequence[Sequence[int]],
                    n_samples: int, delay_tokens: int) -> list[int]:
    """The full input-token sequence (prompt included) of one training stream.

    `word_tokens[i]` are the text token ids of `" " + words[i].text`. Raises `TargetError` when a
    word lies outside the audio or its tokens would run past the end of the padded stream.
    """
    if len(words) != len(word_tokens):
        raise TargetError(f"{len(words)} words but {len(word_tokens)} token lists")
    lay = stream_layout(cfg, n_samples, delay_tokens)
    t = cfg.tokens
    ids = [t.bos] + [t.streaming_pad] * (lay.total - 1)
    audio_s = n_samples / cfg.audio.sampling_rate
    busy_until = lay.prompt_len  # first position the writer is free at
    prev_end = -math.inf
    for w, toks in zip(words, word_tokens):
        if not toks:
            raise TargetError(f"word {w.text!r} has no tokens")
        if not (0.0 <= w.end <= audio_s + 1e-6) or w.end < prev_end - 1e-6:
            raise TargetError(f"word {w.text!r} ends at {w.end:.3f} s: outside the {audio_s:.3f} s audio or "
                              f"before the previous word")
        prev_end = w.end
        q = due_frame(w.end, delay_tokens, lay.n_left, cfg.token_duration_ms)
        if q >= busy_until:
            # the writer is idle here: open a new emission group
            ids[q] = t.streaming_word
            pos = q + 1
        else:
            # still writing an earlier group: this word's tokens follow without a marker
            pos = busy_until
        if pos + len(toks) > lay.total:
            raise TargetError(f"no room for word {w.text!r}: needs positions {pos}..{pos + len(toks) - 1}, "
                              f"stream has {lay.total}")
        ids[pos:pos + len(toks)] = list(toks)
        busy_until = pos + len(toks)
    return ids


def loss_mask_start(cfg: ModelConfig, delay_tokens: int) -> int:
    """First position whose *output* is trained: the last prompt position (it predicts the first
    decided token). Outputs before it would only predict the fixed prompt."""
    return cfg.prompt_length(delay_tokens) - 1


def words_from_ids(cfg: ModelConfig, ids: Sequence[int], decode: Callable[[list[int]], str]) -> list[tuple[int, str]]:
    """(marker position, text) of each emission group in `ids` (for tests and inspection)."""
    groups: list[tuple[int, str]] = []
    cur: list[int] = []
    start = -1
    for p, tok in enumerate(ids):
        if tok == cfg.tokens.streaming_word:
            if cur:
                groups.append((start, decode(cur)))
            cur, start = [], p
        elif tok >= cfg.tokens.num_control_tokens:
            cur.append(tok)
    if cur:
        groups.append((start, decode(cur)))
    return groups
