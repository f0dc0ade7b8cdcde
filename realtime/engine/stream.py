"""Per-stream state of the batched engine (the engine's 'sequence')."""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..audio import IncrementalLogMel
from ..serving import EventCallback
from ..tokenizer import IncrementalDetokenizer


@dataclass
class EngineStream:
    stream_id: int
    slot: int  # row in every per-stream device buffer (conv state, block tables, encoder cache)
    delay_tokens: int
    prompt: list[int]
    on_event: EventCallback
    mel: IncrementalLogMel
    detok: IncrementalDetokenizer
    tokens: list[int] = field(default_factory=list)  # tokens[p]: the input token of LM position p
    audio_done: int = 0  # audio tokens whose embedding has been computed
    lm_pos: int = 0  # next LM position to run
    user_samples: int = 0
    total_tokens: int | None = None  # known after finish: the stream ends when len(tokens) == total
    max_tokens: int | None = None  # admission bound (max session length); the stream is ended there
    finish_requested: bool = False
    ended_by_eos: bool = False
    truncated: bool = False  # ended because it reached max_tokens
    done: bool = False
    closed: bool = False  # its client closed it: events still unsent are not sent (`BatchedEngine._send_tokens`)
    # set by `close_stream` on the client's thread at once (`closed` waits for the engine's next sync), under
    # `notify_lock`, which each event's delivery holds: no event reaches the client after its close returns
    client_closed: bool = False
    notify_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    # audio pushed by the client and not yet handed to the mel front-end (filled under the engine lock)
    inbox: deque = field(default_factory=deque)
    inbox_samples: int = 0
    finish_in_inbox: bool = False
    # wall-clock bookkeeping
    last_scheduled_step: int = -1

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    def audio_tokens_ready(self, mel_frames_per_token: int) -> int:
        """Audio tokens that can be computed now and were not computed yet."""
        total = (self.mel.frames_done + self.mel.available()) // mel_frames_per_token
        return max(0, total - self.audio_done)

    def has_frame(self, mel_frames_per_token: int) -> bool:
        """Whether an LM position can run now: its audio token is encoded, or computable."""
        return self.audio_done > self.lm_pos or self.audio_tokens_ready(mel_frames_per_token) > 0

    def last_position(self) -> float:
        """Highest LM position the stream may still run (its token would be the last one kept);
        infinite while the stream's end is unknown."""
        lim = math.inf
        if self.total_tokens is not None:
            lim = self.total_tokens - 2
        if self.max_tokens is not None:
            lim = min(lim, self.max_tokens - 2)
        return lim

    def is_finished(self) -> bool:
        if self.ended_by_eos or self.truncated:
            return True
        return self.total_tokens is not None and len(self.tokens) >= self.total_tokens

    def ingest(self, chunks: list[np.ndarray]) -> None:
        for c in chunks:
            self.mel.push(c)
            self.user_samples += c.size
