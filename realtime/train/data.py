"""Training batches: streams of one voice's utterances, padded like inference, with targets.

A stream is 1..k utterances of one shard (one voice) separated by random pauses, up to a target
duration drawn per batch (so rows of a batch have similar lengths). It is laid out exactly as the
session lays out audio: `n_left` silent tokens, the user audio, zeros to a whole token plus
`delay + 1 + buffer` tokens. Each row draws its own delay from the allowed set (480 ms twice as
often as any other), so one model serves every delay. Every random choice of batch `i` comes from
generators seeded by (seed, i): a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..audio import log_mel_floor
from ..config import ALLOWED_DELAYS_MS, ModelConfig
from ..tokenizer import TextTokenizer
from .augment import AugmentConfig, apply_masks, augment, draw_eq, draw_masks, draw_warp
from .features import BatchLogMel
from .synth import RawShard
from .targets import TargetError, TimedWord, build_input_ids, loss_mask_start
from .voices import voice_group

logger = logging.getLogger(__name__)

IGNORE = -100


@dataclass
class _Utt:
    shard: int
    start: int  # sample offset in the shard's audio tensor
    length: int
    words: list[TimedWord]
    tokens: list[list[int]]


@dataclass
class Corpus:
    """Utterances of the shards in a folder (those whose `split` is wanted), audio on `device`.

    `part = (rank, world)` keeps only the shards whose name hashes to `rank`: in data-parallel
    training each GPU holds and reads a disjoint quarter (say) of the corpus, and every rank
    decides alone, with no communication, as new shards appear."""

    folder: Path
    tokenizer: TextTokenizer
    device: torch.device
    splits: tuple[str, ...] = ("train",)
    part: tuple[int, int] = (0, 1)
    audio: list[torch.Tensor] = field(default_factory=list)  # int16 per shard
    by_shard: list[list[_Utt]] = field(default_factory=list)
    voices: list[str] = field(default_factory=list)
    _loaded: set[str] = field(default_factory=set)
    _cache: dict[str, list[int]] = field(default_factory=dict)

    def refresh(self) -> int:
        """Load shards that appeared since the last call; returns how many were added."""
        added = 0
        for path in sorted(self.folder.glob("*.npz")):
            if path.name in self._loaded or path.name.endswith(".tmp.npz"):
                continue
            self._loaded.add(path.name)
            rank, world = self.part
            if world > 1 and int(hashlib.md5(path.name.encode()).hexdigest(), 16) % world != rank:
                continue
            shard = RawShard.load(path)
            if shard.split not in self.splits or not shard.texts:
                continue
            idx = len(self.audio)
            utts = []
            for i in range(len(shard.texts)):
                words = shard.words(i)
                toks = [self._encode(w.text) for w in words]
                start = int(shard.offsets[i])
                utts.append(_Utt(idx, start, int(shard.offsets[i + 1]) - start, words, toks))
            self.audio.append(torch.from_numpy(shard.audio).to(self.device))
            self.by_shard.append(utts)
            self.voices.append(shard.voice)
            added += 1
        return added

    def _encode(self, word: str) -> list[int]:
        # the corpus vocabulary is small next to its size: cache the per-word encodings
        toks = self._cache.get(word)
        if toks is None:
            toks = self._cache[word] = self.tokenizer.encode(" " + word)
        return toks

    @property
    def num_utterances(self) -> int:
        return sum(len(u) for u in self.by_shard)

    @property
    def hours(self) -> float:
        return sum(a.numel() for a in self.audio) / 16000 / 3600


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T]: labels[:, p] = input_ids[:, p + 1] where trained, else IGNORE
    mel: torch.Tensor  # [B, n_mels, 8T]
    delay_tokens: torch.Tensor  # [B]
    audio_seconds: float  # user audio in the batch


@dataclass(frozen=True)
class BatchConfig:
    tokens_per_batch: int = 16384  # B x T budget
    min_seconds: float = 3.0  # target user duration per batch, drawn uniformly in this range
    max_seconds: float = 20.0
    max_rows: int = 256
    pause_s: tuple[float, float] = (0.05, 1.2)
    lead_s: tuple[float, float] = (0.0, 0.8)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # Streams pick their shard uniformly, so a voice's share of the batches is its share of the shards,
    # whatever its catalogue weight: a training call's own synthesis (3 flite speakers + formant voices,
    # ~2,400 large shards a rank) outnumbers the carried speech of 32 recorded speakers (480 small ones)
    # about 5 to 1. With `voice_share` > 0 that fraction of the streams first draws a voice by its weight
    # in `voice_weights` (voice key -> weight; unlisted voices 1.0) among the voices loaded, then one of
    # its shards. 0 keeps the uniform draw, and with it the exact batches of earlier runs.
    voice_share: float = 0.0
    voice_weights: tuple[tuple[str, float], ...] = ()


def draw_delay_ms(rng: np.random.Generator) -> int:
    choices = list(ALLOWED_DELAYS_MS) + [480]  # 480 ms (the default) twice as often
    return int(choices[rng.integers(len(choices))])


class StreamBatcher:
    def __init__(self, cfg: ModelConfig, corpus: Corpus, bcfg: BatchConfig, seed: int) -> None:
        self.cfg, self.corpus, self.bcfg, self.seed = cfg, corpus, bcfg, seed
        self.mel = BatchLogMel(cfg.audio, corpus.device)
        self.spt = cfg.samples_per_token
        self.rate = cfg.audio.sampling_rate
        if not 0.0 <= bcfg.voice_share <= 1.0:
            raise ValueError(f"voice_share must be in [0, 1], got {bcfg.voice_share}")
        self._weights = dict(bcfg.voice_weights)
        self._by_voice: dict[str, list[int]] = {}
        self._voice_p: tuple[list[str], np.ndarray] = ([], np.zeros(0))
        self._indexed = 0  # shards of the (growing) corpus grouped by voice so far
        self.streams_by_voice: Counter[str] = Counter()  # streams cut so far, by voice: the mix actually trained

    def stream_shares(self) -> dict[str, float]:
        """Share of the streams cut so far by voice group (engine; mbrola and formant espeak apart)."""
        groups: Counter[str] = Counter()
        for voice, n in self.streams_by_voice.items():
            groups[voice_group(voice)] += n
        total = sum(groups.values()) or 1
        return {g: round(n / total, 4) for g, n in sorted(groups.items())}

    def pick_shard(self, rng: np.random.Generator) -> int:
        """The shard a new stream is cut from (see BatchConfig.voice_share)."""
        shard = self._pick(rng)
        self.streams_by_voice[self.corpus.voices[shard]] += 1
        return shard

    def _pick(self, rng: np.random.Generator) -> int:
        n = len(self.corpus.by_shard)
        if self.bcfg.voice_share == 0.0 or rng.random() >= self.bcfg.voice_share:
            return int(rng.integers(n))
        if self._indexed < n:  # new shards arrived while training: regroup
            for i in range(self._indexed, n):
                self._by_voice.setdefault(self.corpus.voices[i], []).append(i)
            self._indexed = n
            names = sorted(self._by_voice)
            w = np.array([self._weights.get(v, 1.0) for v in names], np.float64)
            self._voice_p = (names, w / w.sum())
        names, p = self._voice_p
        shards = self._by_voice[names[int(rng.choice(len(names), p=p))]]
        return shards[int(rng.integers(len(shards)))]

    def _stream(self, rng: np.random.Generator, target_s: float
                ) -> tuple[list[tuple[int, int, int, int]], list[TimedWord], list[list[int]], int]:
        """Segments (shard, src, dst, length), shifted words, their tokens, user samples."""
        utts = self.corpus.by_shard[self.pick_shard(rng)]
        pos = int(rng.uniform(*self.bcfg.lead_s) * self.rate)
        segs, words, toks = [], [], []
        for _ in range(64):
            u = utts[int(rng.integers(len(utts)))]
            if segs and (pos + u.length) / self.rate > target_s:
                break
            segs.append((u.shard, u.start, pos, u.length))
            off = pos / self.rate
            words += [TimedWord(w.text, w.start + off, w.end + off) for w in u.words]
            toks += u.tokens
            pos += u.length
            if pos / self.rate >= target_s:
                break
            pos += int(rng.uniform(*self.bcfg.pause_s) * self.rate)
        return segs, words, toks, segs[-1][2] + segs[-1][3]

    def batch(self, index: int) -> Batch:
        rng = np.random.default_rng([self.seed, index])
        bc, cfg = self.bcfg, self.cfg
        target_s = float(rng.uniform(bc.min_seconds, bc.max_seconds))
        est_tokens = cfg.streaming.n_left_pad_tokens + int(target_s * 12.5) + 45
        rows = int(np.clip(bc.tokens_per_batch // est_tokens, 1, bc.max_rows))
        items = []
        while len(items) < rows:
            d_ms = draw_delay_ms(rng)
            d = cfg.delay_tokens(d_ms)
            segs, words, toks, n_user = self._stream(rng, target_s)
            try:
                ids = build_input_ids(cfg, words, toks, n_user, d)
            except TargetError as exc:  # a pathological backlog: draw another stream
                logger.debug("stream skipped: %s", exc)
                continue
            items.append((segs, ids, d, n_user))
        t_max = max(len(it[1]) for it in items)
        dev = self.corpus.device
        b = len(items)
        # int16 segment copies (one small kernel each), one conversion for the whole batch
        audio16 = torch.zeros(b, t_max * self.spt, dtype=torch.int16, device=dev)
        user_len = torch.zeros(b, 1, dtype=torch.long)
        input_ids = torch.full((b, t_max), cfg.tokens.streaming_pad, dtype=torch.long)
        labels = torch.full((b, t_max), IGNORE, dtype=torch.long)
        left = cfg.streaming.n_left_pad_tokens * self.spt
        for r, (segs, ids, d, n_user) in enumerate(items):
            for shard, src, dst, n in segs:
                audio16[r, left + dst:left + dst + n] = self.corpus.audio[shard][src:src + n]
            user_len[r] = n_user
            t = len(ids)
            input_ids[r, :t] = torch.tensor(ids)
            s = loss_mask_start(cfg, d)
            labels[r, s:t - 1] = input_ids[r, s + 1:t]
        audio = audio16.float() / 32768.0
        sample = torch.arange(t_max * self.spt, device=dev)
        user = (sample >= left) & (sample < left + user_len.to(dev, non_blocking=True))
        g = torch.Generator(device=dev).manual_seed(self.seed * 1_000_003 + index)
        audio = augment(audio, user, bc.augment, g)
        # VTLP after the other draws (their random streams stay as they were); gated on the config,
        # so a batch without warp (validation) takes the plain log-mel path
        warp = draw_warp(b, bc.augment, g, dev) if bc.augment.p_warp > 0 else None
        n_mels, frames = cfg.audio.num_mel_bins, audio.shape[-1] // cfg.audio.hop_length
        # spectral masks and the equaliser after the warp, in that order (earlier streams unchanged)
        masks = draw_masks(b, n_mels, frames, bc.augment, g, dev) if bc.augment.p_mask > 0 else None
        eq = draw_eq(b, n_mels, bc.augment, g, dev) if bc.augment.p_eq > 0 else None
        mel = self.mel(audio, warp, eq)
        if masks is not None:
            mel = apply_masks(mel, masks, log_mel_floor(cfg.audio))
        delays = torch.tensor([it[2] for it in items], dtype=torch.long)
        secs = sum(it[3] for it in items) / self.rate
        return Batch(input_ids.to(dev, non_blocking=True), labels.to(dev, non_blocking=True), mel,
                     delays.to(dev, non_blocking=True), secs)
