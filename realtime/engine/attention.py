"""Attention backends of the batched engine (the model calls `backend.attend(layer, q, k, v)`).

- `PagedAttention`: a batch of short queries (LM decode: 1 per stream; encoder step: 4 per stream)
  whose keys/values are written into the paged cache and then read back through the ring tables.
- `PrefillAttention`: one new stream's first chunk: dense masked attention over the chunk itself
  (the stream has no history yet), and the chunk's keys/values are written to the pages.
"""

from __future__ import annotations

import torch

from kernels.paged_attention import paged_attention, write_kv

from ..attention import masked_attention, window_mask
from .kv_cache import PagedKVCache


class PagedAttention:
    def __init__(self, cache: PagedKVCache, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 seq_ids: torch.Tensor, q_pos: torch.Tensor, tokens_per_run: int = 1) -> None:
        """tokens_per_run: the queries come in runs of this many rows of one stream (encoder: the 4
        frames of an audio token), which lets the kernel read each key block once per run."""
        self.cache = cache
        self.slot_mapping, self.block_tables, self.seq_ids, self.q_pos = slot_mapping, block_tables, seq_ids, q_pos
        self.tokens_per_run = tokens_per_run
        self.window = cache.spec.window
        self.scale = cache.spec.head_dim ** -0.5

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # [1, T, H, D]: the batch is flattened into one row of tokens
        write_kv(self.cache.k[layer], self.cache.v[layer], k[0], v[0], self.slot_mapping)
        out = paged_attention(q[0], self.cache.k[layer], self.cache.v[layer], self.block_tables, self.seq_ids,
                              self.q_pos, self.window, self.scale, tokens_per_run=self.tokens_per_run)
        return out[None]


class PrefillAttention:
    """New streams' first chunks, [B, T] with the same positions 0..T-1 in every row."""

    def __init__(self, cache: PagedKVCache, stream_slots: int | list[int], positions: torch.Tensor) -> None:
        if isinstance(stream_slots, int):
            stream_slots = [stream_slots]
        self.cache = cache
        self.mask = window_mask(positions[None], positions[None], cache.spec.window)
        keep = positions >= cache.oldest_kept(positions.numel() - 1)  # only what the ring holds
        slot_t = torch.tensor(stream_slots, device=positions.device, dtype=torch.int64)
        slots = cache.slot_mapping(slot_t[:, None].expand(-1, positions.numel()), positions[None].expand(len(stream_slots), -1))
        self.slot_mapping = torch.where(keep[None], slots, torch.full_like(slots, -1)).reshape(-1)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t = k.shape[:2]
        write_kv(self.cache.k[layer], self.cache.v[layer], k.reshape(b * t, *k.shape[2:]),
                 v.reshape(b * t, *v.shape[2:]), self.slot_mapping)
        return masked_attention(q, k, v, self.mask)
