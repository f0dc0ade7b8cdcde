"""One live stream: push audio in any chunking, get tokens and text deltas as frames become decodable.

Timeline (DESIGN §1.3): the stream starts with `n_left_pad_tokens` tokens of silence; LM position p
sees `embed(token[p]) + audio_embed[p]`; the prompt (BOS + streaming pads) fills positions
`0 .. P-1`, and each LM step at position p >= P-1 decides token p + 1. Audio token t needs mel
frames up to 8t + 7, i.e. samples up to 1280(t + 1) + 40 of the padded stream.

The work is always split the same way (one prefill of P audio tokens, then one token per step),
whatever the push sizes, so streaming output is identical to offline output. `transcribe()` is
this session fed with one chunk.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from .attention import SlidingWindowCache
from .audio import AudioError, IncrementalLogMel, as_mono_float32
from .model import VoxtralRealtime
from .tokenizer import IncrementalDetokenizer, TextTokenizer

logger = logging.getLogger(__name__)


class SessionError(RuntimeError):
    """A session used out of order (audio after finish, and so on)."""


@dataclass(frozen=True, slots=True)  # one a token of every offline stream and session
class TokenEvent:
    token_id: int
    position: int  # LM position of the token
    text: str  # text delta this token completes ("" for control tokens)
    audio_end_ms: int  # user audio (ms from the stream start) the model had seen when deciding it


@dataclass
class TranscriptionResult:
    text: str
    token_ids: list[int]
    events: list[TokenEvent] = field(default_factory=list)
    prompt_tokens: int = 0


class StreamingSession:
    def __init__(self, model: VoxtralRealtime, tokenizer: TextTokenizer, *, delay_ms: int | None = None) -> None:
        cfg = model.config
        self.model, self.cfg = model, cfg
        self.delay_tokens = cfg.delay_tokens(delay_ms)
        self.delay_ms = self.delay_tokens * cfg.token_duration_ms
        self.prompt = cfg.prompt_ids(self.delay_tokens)
        self.tokens: list[int] = list(self.prompt)  # tokens[p] is the input token of position p
        self._device, self._dtype = model.device, model.dtype

        self._mel = IncrementalLogMel.for_stream(cfg)
        self._conv_state = model.audio_tower.embedder.initial_state(1, self._device, self._dtype)
        self._enc_cache = SlidingWindowCache(cfg.encoder.num_layers, cfg.encoder.sliding_window)
        self._dec_cache = SlidingWindowCache(cfg.decoder.num_layers, cfg.decoder.sliding_window)
        self._audio: list[torch.Tensor] = []  # audio embeddings [1, H] for positions >= self._lm_pos
        self._audio_tokens_done = 0
        self._lm_pos = 0  # next LM position to run
        delay_t = torch.tensor([self.delay_tokens], device=self._device)
        self._t_cond = model.t_cond(delay_t)[:, None, :]
        self._ada = model.ada_scales_for(delay_t)  # None unless the model prepared its delay table
        self._detok = IncrementalDetokenizer(tokenizer)
        self.user_samples = 0
        self.total_tokens: int | None = None  # known once finish() fixed the right padding
        self.finished = False
        self.ended_by_eos = False

    # -- public API --------------------------------------------------------------------------
    @property
    def text(self) -> str:
        return self._detok.text

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def done(self) -> bool:
        return self.ended_by_eos or (self.total_tokens is not None and len(self.tokens) >= self.total_tokens)

    def push_audio(self, samples: object) -> list[TokenEvent]:
        if self.finished:
            raise SessionError("push_audio() after finish(): start a new session")
        arr = as_mono_float32(samples)
        if self.ended_by_eos:
            logger.warning("session already ended with EOS; %d samples not transcribed", arr.size)
            return []
        self.user_samples += arr.size
        self._mel.push(torch.from_numpy(arr))
        return self._run()

    def finish(self) -> list[TokenEvent]:
        """End of audio: pad right (to a whole token, then delay + 11 tokens) and decode to the end."""
        if self.finished:
            raise SessionError("finish() called twice")
        self.finished = True
        pad, self.total_tokens = self.cfg.finish_padding(self.user_samples, self.delay_tokens)
        self._mel.push(torch.zeros(pad))
        events = self._run()
        tail = self._detok.flush()
        if tail:
            last = events[-1] if events else None
            events.append(TokenEvent(-1, last.position if last else len(self.tokens), tail,
                                     last.audio_end_ms if last else 0))
        return events

    # -- internals ---------------------------------------------------------------------------
    def _audio_tokens_ready(self) -> int:
        """Audio tokens whose 8 mel frames can be computed now (beyond those already done)."""
        mpt = self.cfg.streaming.mel_frames_per_token
        frames_total = self._mel.frames_done + self._mel.available()
        return frames_total // mpt - self._audio_tokens_done

    @torch.no_grad()
    def _compute_audio(self, n_tokens: int) -> None:
        mpt = self.cfg.streaming.mel_frames_per_token
        fpt = self.cfg.streaming.downsample_factor
        mel = self._mel.compute(n_tokens * mpt, self._device)[None]
        start = self._audio_tokens_done * fpt
        pos = torch.arange(start, start + n_tokens * fpt, device=self._device)[None]
        self._enc_cache.begin(pos)
        emb, self._conv_state = self.model.encode(mel, self._conv_state, pos, self._enc_cache)
        self._audio.extend(emb[0, i: i + 1] for i in range(n_tokens))
        self._audio_tokens_done += n_tokens

    @torch.no_grad()
    def _lm_step(self, n_positions: int) -> int:
        p0 = self._lm_pos
        ids = torch.tensor(self.tokens[p0: p0 + n_positions], device=self._device)[None]
        audio = torch.cat(self._audio[:n_positions])[None]
        del self._audio[:n_positions]
        pos = torch.arange(p0, p0 + n_positions, device=self._device)[None]
        self._dec_cache.begin(pos)
        hidden = self.model.decode(self.model.embed_tokens(ids) + audio, pos, self._t_cond, self._dec_cache, self._ada)
        next_id = int(self.model.logits(hidden[:, -1]).argmax(-1).item())
        self._lm_pos += n_positions
        return next_id

    def _run(self) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        prompt_len = len(self.prompt)
        while not self.done:
            if self._lm_pos == 0:
                # prefill: the whole prompt at once, which needs P audio tokens
                if self._audio_tokens_ready() + self._audio_tokens_done < prompt_len:
                    break
                self._compute_audio(prompt_len - self._audio_tokens_done)
                n = prompt_len
            else:
                if not self._audio and self._audio_tokens_ready() < 1:
                    break
                if not self._audio:
                    self._compute_audio(1)
                n = 1
            next_id = self._lm_step(n)
            pos = self._lm_pos  # the position whose input token was just decided
            self.tokens.append(next_id)
            text = "" if next_id == self.cfg.tokens.eos else self._detok.push(next_id)
            events.append(TokenEvent(next_id, pos, text, self.cfg.audio_end_ms(pos)))
            if next_id == self.cfg.tokens.eos:
                self.ended_by_eos = True
        return events


def transcribe(model: VoxtralRealtime, tokenizer: TextTokenizer, audio: object, *, delay_ms: int | None = None
               ) -> TranscriptionResult:
    """Offline transcription of a whole clip (16 kHz mono float), through the streaming session."""
    arr = as_mono_float32(audio)
    if arr.size == 0:
        raise AudioError("audio is empty: nothing to transcribe")
    session = StreamingSession(model, tokenizer, delay_ms=delay_ms)
    events = session.push_audio(arr) + session.finish()
    return TranscriptionResult(session.text, session.generated, events, len(session.prompt))
