"""Encoder look-ahead for speculation: several audio tokens per stream per step into the encoder cache.

Speculating k tokens at LM position p needs the audio embeddings of positions p .. p+k, so the
encoder must run ahead of the LM. One call encodes `n` consecutive audio tokens for each stream of
a batch (n a power of two up to the largest chunk): mel [B, n_mels, 8n] through the conv stem (per
stream state), the encoder layers (paged sliding-window attention, 4n query frames per stream:
the encoder ring is sized for `fpt * max_step_tokens` queries, so n <= max_step_tokens) and the
adapter; the n embeddings of each stream land in the runner's `audio_cache` ring at rows
`slot * C + position % C`. A stream that needs 7 tokens runs in the 4-, 2- and 1-token calls of
the step, in that order (its tokens stay in sequence: each call starts where the last ended).

Buffers are persistent (their index metadata comes in one host copy per call, `staging`) and, on
CUDA, each chunk size has graphs per batch bucket, captured on padding rows like the decode graphs;
the eager path runs the same code on the exact batch.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .attention import PagedAttention
from .cuda_graph import DecodeGraphRunner
from .model_runner import ModelRunner
from .staging import Field, StepMetadata
from .stream import EngineStream

logger = logging.getLogger(__name__)


def chunk_sizes(max_chunk: int) -> list[int]:
    """Powers of two up to `max_chunk`, largest first."""
    sizes, n = [], 1
    while n <= max_chunk:
        sizes.append(n)
        n *= 2
    return sizes[::-1]


def host_slot_mapping(blocks: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Flat cache slots of `positions` in a ring of physical `blocks` (as PagedKVCache.slot_mapping)."""
    return blocks[(positions // block_size) % len(blocks)].astype(np.int64) * block_size + positions % block_size


class LookaheadEncoder:
    def __init__(self, runner: ModelRunner, max_chunk: int, enc_blocks: dict[int, np.ndarray]) -> None:
        """enc_blocks: host copy of each slot's encoder ring (kept current by the owner)."""
        c = runner.cfg
        if max_chunk > runner.opts.max_step_tokens:
            raise ValueError(f"encoder chunk {max_chunk} exceeds max_step_tokens {runner.opts.max_step_tokens} "
                             "(the encoder KV ring is sized for that many tokens per call)")
        if max_chunk > runner.cache_len:
            raise ValueError(f"encoder chunk {max_chunk} exceeds the audio cache ring ({runner.cache_len} tokens)")
        self.runner, self.enc_blocks = runner, enc_blocks
        self.sizes = chunk_sizes(max_chunk)
        self.max_chunk = self.sizes[0]
        self.fpt = fpt = c.streaming.downsample_factor
        self.mpt = c.streaming.mel_frames_per_token
        b, dev, dt = runner.opts.max_batch, runner.device, runner.dtype
        width = runner.enc_cache.width
        self.mel = {n: torch.zeros(b, c.audio.num_mel_bins, self.mpt * n, device=dev, dtype=dt) for n in self.sizes}
        # which stream (row of `tables`) each query frame belongs to, per chunk size (constant)
        self.seq = {n: torch.arange(b, dtype=torch.int32, device=dev).repeat_interleave(fpt * n) for n in self.sizes}
        pad_row = runner.pad_slot * runner.cache_len
        self.meta = {n: StepMetadata({
            "slots": Field((b,), torch.int64, runner.pad_slot),  # conv-state row (pad row for padding)
            "pos": Field((b * fpt * n,), torch.int32, -1),  # encoder frame positions (-1: padding)
            "slot_mapping": Field((b * fpt * n,), torch.int64, -1),
            "tables": Field((b, width), torch.int32, 0),
            "rows": Field((b * n,), torch.int64, pad_row),  # audio cache rows of the new embeddings
        }, dev) for n in self.sizes}
        self.graphs: dict[int, DecodeGraphRunner] = {}
        if runner.opts.cuda_graphs and dev.type == "cuda":
            for n in self.sizes:
                g = DecodeGraphRunner(lambda bb, n=n: self._forward(n, bb), b, dev)
                g.capture()
                self.graphs[n] = g
            logger.info("captured look-ahead encoder graphs for chunks %s", self.sizes)

    def _forward(self, n: int, b: int) -> None:
        """Encode `n` tokens for the first `b` rows of the buffers (graph-capturable)."""
        r, m = self.runner, self.meta[n].dev
        rows = b * self.fpt * n
        slots = m["slots"][:b]
        state = (r.conv1_state.index_select(0, slots), r.conv2_state.index_select(0, slots))
        frames, (s1, s2) = r.model.audio_tower.embedder(self.mel[n][:b], state)
        r.conv1_state.index_copy_(0, slots, s1)
        r.conv2_state.index_copy_(0, slots, s2)
        pos = m["pos"][:rows]
        backend = PagedAttention(r.enc_cache, m["slot_mapping"][:rows], m["tables"], self.seq[n][:rows], pos)
        hidden = r.model.audio_tower(frames.reshape(1, rows, -1), pos[None], backend)
        # the adapter stacks 4 consecutive frames: each stream's 4n frames are contiguous and aligned
        r.audio_cache.index_copy_(0, m["rows"][: b * n], r.model.multi_modal_projector(hidden)[0])

    @torch.no_grad()
    def encode(self, work: list[tuple[EngineStream, int]]) -> None:
        """Encode `count` more audio tokens for each (stream, count); advances `stream.audio_done`."""
        top = self.max_chunk
        # counts above the largest chunk take several full-chunk calls; the rest is binary
        for i in range(max((count // top for _, count in work), default=0)):
            self._encode_group([s for s, count in work if count // top > i], top)
        for n in self.sizes[1:]:
            self._encode_group([s for s, count in work if count & n], n)

    def _encode_group(self, group: list[EngineStream], n: int) -> None:
        if not group:
            return
        r, fpt = self.runner, self.fpt
        b = len(group)
        mel = r._mel_batch(group, n)  # [b, n_mels, 8n] (advances each stream's mel front-end)
        h = self.meta[n].begin()
        bs, cl = r.enc_cache.spec.block_size, r.cache_len
        frame_offsets = np.arange(fpt * n)
        for i, s in enumerate(group):
            blocks = self.enc_blocks[s.slot]
            frames = s.audio_done * fpt + frame_offsets
            h["slots"][i] = s.slot
            h["pos"][i * fpt * n: (i + 1) * fpt * n] = frames
            h["slot_mapping"][i * fpt * n: (i + 1) * fpt * n] = host_slot_mapping(blocks, frames, bs)
            h["tables"][i] = blocks
            h["rows"][i * n: (i + 1) * n] = s.slot * cl + (s.audio_done + np.arange(n)) % cl
        self.meta[n].upload()
        self.mel[n][:b] = mel
        graphs = self.graphs.get(n)
        if graphs is not None:
            graphs.replay(graphs.bucket(b))
        else:
            self._forward(n, b)
        for s in group:
            s.audio_done += n
