"""Audio times of tokens and words.

Convention (one 80 ms step = one LM position; `n_left` = the model's left-pad tokens, `d` = the
stream's delay in tokens, `T` = 80 ms):

* The token decided at LM position `p` (the `position` of `serving.StreamToken`) transcribes the
  80 ms audio frame `[(p - n_left - d - 1) * T, (p - n_left - d) * T)` of the stream: the model
  had seen audio up to `(p - n_left) * T` (`StreamToken.audio_end_ms`) and lags it by the delay.
* Times are clamped to the audio the client actually sent (the right padding added at the end of
  a stream is not the client's audio) and shifted by the stream's offset into the client's time
  base (the utterance in the vLLM dialect, the session's audio in the OpenAI dialect).
* A word starts with a token whose text begins with whitespace (the tokenizer keeps the leading
  space of words) and ends with the token before the next such token (or the end of the stream).
  Its `start_ms` is the start of its first token's frame, its `end_ms` the end of its last one.
  Tokens without text (pads, word markers) do not extend a word.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenClock:
    n_left_pad_tokens: int
    delay_tokens: int
    token_ms: int

    def frame_ms(self, position: int) -> tuple[int, int]:
        """Stream-relative (start, end) ms of the audio frame the token at `position` transcribes."""
        end = (position - self.n_left_pad_tokens - self.delay_tokens) * self.token_ms
        return end - self.token_ms, end


@dataclass(frozen=True)
class Word:
    word: str
    start_ms: int
    end_ms: int

    def to_json(self) -> dict[str, object]:
        return {"word": self.word, "start_ms": self.start_ms, "end_ms": self.end_ms}


@dataclass
class WordTracker:
    """Groups token texts into words; `push` returns the words a token completed."""

    _text: str = ""
    _start: int = 0
    _end: int = 0
    words: list[Word] = field(default_factory=list)

    def push(self, text: str, start_ms: int, end_ms: int) -> list[Word]:
        done: list[Word] = []
        i = 0
        while i < len(text):
            if text[i].isspace():
                w = self._close()
                if w is not None:
                    done.append(w)
                i += 1
                continue
            j = i
            while j < len(text) and not text[j].isspace():
                j += 1
            if not self._text:
                self._start = start_ms
            self._text += text[i:j]
            self._end = end_ms
            i = j
        return done

    def _close(self) -> Word | None:
        if not self._text:
            return None
        w = Word(self._text, self._start, max(self._start, self._end))
        self.words.append(w)
        self._text = ""
        return w

    def flush(self) -> list[Word]:
        w = self._close()
        return [] if w is None else [w]


def words_of_tokens(tokens: Iterable[tuple[int, str]], clock: TokenClock, audio_ms: int) -> list[Word]:
    """Every word of a finished stream from its tokens' (LM position, text), in order, with the conventions above
    (frames clamped to the `audio_ms` of audio the stream had): what a streaming session reports word by word."""
    tracker = WordTracker()
    for position, text in tokens:
        if text:
            start, end = clock.frame_ms(position)
            tracker.push(text, min(max(start, 0), audio_ms), min(max(end, 0), audio_ms))
    tracker.flush()
    return tracker.words
