"""Attention backends of the batched engine (the model calls `backend.attend(layer, q, k, v)`).

- `PagedAttention`: a batch of short queries (LM decode: 1 per stream; encoder step: 4 per stream)
  whose keys/values are written into the paged cache and then read back through the ring tables
  (a verify step's draft-tree rows read their ancestors' keys from listed slots instead).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from kernels.paged_attention import RunsPlan, paged_attention, write_kv

from .kv_cache import PagedKVCache


class PagedAttention:
    # the one-row decode's q/k/v projection writes the keys and values itself (`realtime.model.SupportsFusedKVWrite`)
    supports_fused_kv_write: ClassVar[Literal[True]] = True

    def __init__(self, cache: PagedKVCache, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 seq_ids: torch.Tensor, q_pos: torch.Tensor, tokens_per_run: int = 1,
                 tree_root: torch.Tensor | None = None, tree_slots: torch.Tensor | None = None,
                 num_splits: int | None = None) -> None:
        """tokens_per_run: the queries come in runs of this many rows of one stream (encoder: the 4
        frames of an audio token), which lets the kernel read each key block once per run.
        tree_root/tree_slots: draft-tree rows read their ancestors' keys from listed slots
        (`kernels.paged_attention`; speculation's tree verification).
        num_splits: the kernel's key splits (None: its own choice from the shapes; the encoder passes
        `kernels.paged_attention.splits_for_streams`, so that a stream's result does not depend on its chunk)."""
        self.tree_root, self.tree_slots = tree_root, tree_slots
        self.cache = cache
        self.slot_mapping, self.block_tables, self.seq_ids, self.q_pos = slot_mapping, block_tables, seq_ids, q_pos
        self.tokens_per_run = tokens_per_run
        self.num_splits = num_splits
        self.window = cache.spec.window
        self.scale = cache.spec.head_dim ** -0.5
        self.plan = RunsPlan()  # the CPU path's index work: made by the first layer, reused by the others

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # [1, T, H, D]: the batch is flattened into one row of tokens
        write_kv(self.cache.k[layer], self.cache.v[layer], k[0], v[0], self.slot_mapping)
        return self.attend_cached(layer, q)

    def kv_destination(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cache.k[layer], self.cache.v[layer], self.slot_mapping

    def attend_cached(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        out = paged_attention(q[0], self.cache.k[layer], self.cache.v[layer], self.block_tables, self.seq_ids,
                              self.q_pos, self.window, self.scale, tokens_per_run=self.tokens_per_run,
                              tree_root=self.tree_root, tree_slots=self.tree_slots, plan=self.plan,
                              num_splits=self.num_splits, rings_finite=self.cache.rings_finite)
        return out[None]
