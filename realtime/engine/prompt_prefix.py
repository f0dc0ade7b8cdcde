"""Joining without a prefill step: the prompt's silent prefix comes from a cache, the rest runs as decode rows.

Every stream starts with the same prompt: BOS + streaming pads (one per left-pad token and one per
delay token), over audio that begins with `n_left_pad_tokens` tokens of silence. The first K LM
positions read only prompt tokens and audio tokens computed from silence alone, so their keys and
values (LM and encoder) and the conv stem's state after them are the same for every stream with
that delay. `PromptPrefixCache` computes them once per delay and copies them into a joining
stream's pages; the stream then enters the batch like any live stream at position K, and its
remaining prompt positions (those whose audio includes the user's first samples) run as ordinary
rows of the graph-replayed decode steps, one per step as that audio arrives, their outputs
discarded until the last prompt position. A join therefore costs a few small copies instead of an
eager prefill that stalls every other stream (the paced benchmark's join-phase p99).

The prefix also keeps the audio embeddings and the target's final hidden states of its positions:
with speculation on, the Eagle drafter's prefix KV is made from them once per delay
(`speculation.Speculator.join`), and the prompt rows hand their hidden states to the drafter
through the speculative step's catch-up like any other row.

Audio token t reads mel frames 8t..8t+7; frame f reads stream samples [hop*f - n_fft/2,
hop*f + n_fft/2). The conv stem and the encoder attention are causal, and the log-mel is normalised
by a constant, so token t is silent-only when its last frame ends inside the left padding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..attention import DenseAttention
from ..config import ModelConfig
from .kv_cache import PagedKVCache
from .stream import EngineStream

if TYPE_CHECKING:  # the runner owns this cache
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


def silent_prefix_tokens(cfg: ModelConfig, delay_tokens: int) -> int:
    """K: leading LM positions whose every input is independent of the stream's audio (and at least
    one prompt position is left to run as a decode row: its output is the first real token)."""
    a, s = cfg.audio, cfg.streaming
    half = a.n_fft // 2
    # frame f is silent-only iff hop*f + half <= left_pad_samples
    silent_frames = max(0, (cfg.left_pad_samples - half) // a.hop_length + 1)
    return min(silent_frames // s.mel_frames_per_token, cfg.prompt_length(delay_tokens) - 1)


class RecordingAttention(DenseAttention):
    """Dense attention over one chunk (one stream) that keeps each layer's keys and values."""

    def __init__(self, positions: torch.Tensor, window: int | None, num_layers: int) -> None:
        super().__init__(positions[None], window)
        self.k: list[torch.Tensor] = [torch.empty(0)] * num_layers
        self.v: list[torch.Tensor] = [torch.empty(0)] * num_layers

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k[layer], self.v[layer] = k[0].clone(), v[0].clone()  # [T, H, D]
        return super().attend(layer, q, k, v)


@dataclass(frozen=True)
class PromptPrefix:
    tokens: int  # K: LM positions (and audio tokens) covered
    enc_k: list[torch.Tensor]  # per encoder layer [K * fpt, H, D]
    enc_v: list[torch.Tensor]
    lm_k: list[torch.Tensor]  # per LM layer [K, H_kv, D]
    lm_v: list[torch.Tensor]
    conv1_state: torch.Tensor  # the conv stem's state after the prefix's mel frames
    conv2_state: torch.Tensor
    audio: torch.Tensor  # [K, H] audio embeddings of the prefix positions
    hidden: torch.Tensor  # [K, H] the target's final hidden states there (what decides token q+1)


class PromptPrefixCache:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._by_delay: dict[int, PromptPrefix] = {}

    def get(self, delay_tokens: int) -> PromptPrefix:
        if delay_tokens not in self._by_delay:
            self._by_delay[delay_tokens] = self._compute(delay_tokens)
        return self._by_delay[delay_tokens]

    @torch.no_grad()
    def _compute(self, delay_tokens: int) -> PromptPrefix:
        r = self.runner
        model, c, dev = r.model, r.cfg, r.device
        k = silent_prefix_tokens(c, delay_tokens)
        fpt, mpt = c.streaming.downsample_factor, c.streaming.mel_frames_per_token
        conv = model.audio_tower.embedder.initial_state(1, dev, model.dtype)
        if k == 0:  # no silent prefix (little or no left padding): the whole prompt runs as decode rows
            none = torch.zeros(0, c.decoder.hidden_size, device=dev, dtype=model.dtype)
            return PromptPrefix(0, [], [], [], [], conv[0][0], conv[1][0], none, none)
        silence = torch.zeros(1, r.mel.samples_needed(k * mpt))
        mel = r.log_mel(silence, k * mpt)  # the same front-end as live audio
        enc_pos = torch.arange(k * fpt, device=dev)
        enc = RecordingAttention(enc_pos, c.encoder.sliding_window, c.encoder.num_layers)
        with model.encoder_rows(r.encoder_rows):  # the rows the runner's own encoder calls use
            audio, (s1, s2) = model.encode(mel, conv, enc_pos[None], enc)
        pos = torch.arange(k, device=dev)
        lm = RecordingAttention(pos, c.decoder.sliding_window, c.decoder.num_layers)
        delay = torch.tensor([delay_tokens], device=dev)
        ids = torch.tensor([c.prompt_ids(delay_tokens)[:k]], device=dev)
        hidden = model.decode(model.embed_tokens(ids) + audio, pos[None], model.t_cond(delay)[:, None, :], lm,
                              model.ada_scales_for(delay))
        logger.info("prompt prefix for delay %d: %d of %d prompt positions from cache", delay_tokens, k,
                    c.prompt_length(delay_tokens))
        return PromptPrefix(k, enc.k, enc.v, lm.k, lm.v, s1[0], s2[0], audio[0], hidden[0])

    @torch.no_grad()
    def apply(self, streams: list[EngineStream]) -> None:
        """Newly admitted streams start at position K with the prefix's caches and conv state (one
        copy per cache tensor for all streams of a delay, so a burst of joins costs little more
        than one)."""
        for delay, group in streams_by_delay(streams).items():
            self._apply(self.get(delay), group)

    def _apply(self, p: PromptPrefix, group: list[EngineStream]) -> None:
        r = self.runner
        fpt, mpt = r.cfg.streaming.downsample_factor, r.cfg.streaming.mel_frames_per_token
        slots = torch.tensor([s.slot for s in group], device=r.device)
        r.conv1_state.index_copy_(0, slots, p.conv1_state.expand(len(group), -1, -1).contiguous())
        r.conv2_state.index_copy_(0, slots, p.conv2_state.expand(len(group), -1, -1).contiguous())
        if p.tokens:
            write_pages(r.enc_cache, [s.slot for s in group], p.tokens * fpt, p.enc_k, p.enc_v)
            write_pages(r.lm_cache, [s.slot for s in group], p.tokens, p.lm_k, p.lm_v)
        for s in group:
            if p.tokens:
                s.mel.advance(p.tokens * mpt)
            s.audio_done = s.lm_pos = p.tokens


def streams_by_delay(streams: list[EngineStream]) -> dict[int, list[EngineStream]]:
    """Joining streams grouped by delay: every stream of a group shares one prefix, copied in at once."""
    groups: dict[int, list[EngineStream]] = {}
    for s in streams:
        groups.setdefault(s.delay_tokens, []).append(s)
    return groups


def write_pages(cache: PagedKVCache, stream_slots: list[int], n: int, ks: list[torch.Tensor],
                vs: list[torch.Tensor]) -> None:
    """Positions 0..n-1 into each stream's pages (those its ring holds: `PagedKVCache.oldest_kept`)."""
    first = cache.oldest_kept(n - 1)
    pos = np.arange(first, n)
    flat = np.concatenate([cache.host_slots(slot, pos) for slot in stream_slots])
    slots = torch.from_numpy(flat).to(cache.k[0].device)
    reps = len(stream_slots)
    for layer, (k, v) in enumerate(zip(ks, vs)):
        cache.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k[first:].repeat(reps, 1, 1))
        cache.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v[first:].repeat(reps, 1, 1))
