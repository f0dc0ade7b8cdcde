"""Paged key/value caches with per-stream ring block tables, and the admission arithmetic.

Layout (per layer): `k`, `v` [num_blocks, block_size, kv_heads, head_dim]. A stream owns a ring of
`width` physical blocks, those of its slot (slot s: blocks s*width .. s*width + width - 1, so each ring lies
whole in the pages); logical block b (= position // block_size) lives in ring slot b % width.
The ring is sized so every position still inside the sliding window (plus the queries of one
step) has its own slot: when the window slides past a block, that block is recycled in place for
the newest positions. Memory per stream is therefore fixed by the window: a 3-hour stream costs
what an 11-minute one does, and a stream that is admitted can never run out of KV mid-stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


def ring_width(window: int | None, block_size: int, max_q_len: int, max_positions: int | None) -> int:
    """Blocks a stream needs so that no position a query can see is ever overwritten.

    A query at p reads positions p-window+1 .. p; the newest step writes up to max_q_len positions
    ending at p. Those span window + max_q_len - 1 positions, touching at most
    ceil((window + max_q_len - 1) / block_size) + 1 blocks.
    """
    span = (window + max_q_len - 1) if window is not None else None
    if max_positions is not None:
        span = max_positions if span is None else min(span, max_positions)
    if span is None:
        raise ValueError("a cache without a sliding window needs a maximum session length")
    return math.ceil(span / block_size) + 1


@dataclass(frozen=True)
class CacheSpec:
    num_layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    window: int | None
    max_q_len: int

    def bytes_per_block(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.block_size * self.kv_heads * self.head_dim * torch.empty(0, dtype=dtype).element_size()

    def blocks_per_stream(self, max_positions: int | None) -> int:
        return ring_width(self.window, self.block_size, self.max_q_len, max_positions)


class BlockPool:
    """Which physical blocks are free. Rings take their slot's own blocks (`take_exact`); anything else (a draft
    tree's scratch) takes the highest free ids (`take`), which lie past every ring."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._is_free = np.ones(num_blocks, dtype=bool)
        self._free = num_blocks

    @property
    def free(self) -> int:
        return self._free

    def take(self, n: int) -> list[int]:
        if n > self._free:
            raise MemoryError(f"{n} blocks requested, {self._free} free")
        out = np.flatnonzero(self._is_free)[self._free - n:] if n else np.zeros(0, dtype=np.int64)
        self._is_free[out] = False
        self._free -= n
        return out.tolist()

    def take_exact(self, first: int, n: int) -> list[int]:
        """Blocks first .. first + n - 1, all of which must be free."""
        if first < 0 or first + n > self.num_blocks or not self._is_free[first:first + n].all():
            raise MemoryError(f"blocks {first}..{first + n - 1} are not all free")
        self._is_free[first:first + n] = False
        self._free -= n
        return list(range(first, first + n))

    def give_back(self, blocks: list[int]) -> None:
        ids = np.asarray(blocks, dtype=np.int64)
        if self._is_free[ids].any() or np.unique(ids).size != ids.size:
            raise ValueError("a block given back twice")
        self._is_free[ids] = True
        self._free += ids.size


class PagedKVCache:
    """All layers' K/V pages plus one ring block table per stream slot."""

    def __init__(self, spec: CacheSpec, num_blocks: int, max_streams: int, max_positions: int | None,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.spec = spec
        self.width = spec.blocks_per_stream(max_positions)
        shape = (num_blocks, spec.block_size, spec.kv_heads, spec.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_layers)]
        self.pool = BlockPool(num_blocks)
        # -1 marks unused table entries; a stream's whole ring is reserved at admission. The host
        # mirror lets step metadata (slot mappings, table rows) be built on the host and uploaded once.
        self.tables = torch.full((max_streams, self.width), -1, dtype=torch.int32, device=device)
        self.tables_host = np.full((max_streams, self.width), -1, dtype=np.int32)
        # per slot, the flat cache slot of every ring position (position % ring_positions), -1 while the
        # slot is free: a step's slot mappings, of one stream or of many, are then one indexing on the host
        # (8 bytes per ring position and slot: 1.75 KiB per slot for the default model's LM ring, 3.4 KiB for
        # its encoder ring; a server sized for N streams holds this for all N)
        self.ring_positions = self.width * spec.block_size
        self._slots_host = np.full((max_streams, self.ring_positions), -1, dtype=np.int64)
        self._owned: dict[int, list[int]] = {}

    @property
    def rings_finite(self) -> bool:
        """Whether a ring's slots hold only zeros or what its own stream wrote (`kernels.paged_attention`'s
        `rings_finite`: finite, since audio with NaN or inf is refused at the door): the pages start zeroed, and
        on the CPU a ring is zeroed again when a stream is admitted to it, so no slot holds what an earlier
        stream left. (On CUDA admission skips the memset: the Triton kernel reads no slot outside a row's range.)"""
        return self.k[0].device.type == "cpu"

    def can_admit(self) -> bool:
        return self.pool.free >= self.width

    def admit(self, slot: int) -> None:
        # slot s owns blocks s*width .. s*width + width - 1: each ring lies whole and in slot order in the pages,
        # which lets the CPU attention read rings in place (`rings_finite`)
        blocks = self.pool.take_exact(slot * self.width, self.width)
        if self.rings_finite:
            for pages in (*self.k, *self.v):
                pages[blocks[0]:blocks[-1] + 1].zero_()
        self._owned[slot] = blocks
        self.tables_host[slot] = blocks
        self.tables[slot] = torch.from_numpy(self.tables_host[slot]).to(self.tables.device)
        bs = self.spec.block_size
        self._slots_host[slot] = (np.asarray(blocks, dtype=np.int64)[:, None] * bs + np.arange(bs)).ravel()

    def release(self, slot: int) -> None:
        blocks = self._owned.pop(slot, None)
        if blocks is not None:
            self.pool.give_back(blocks)
            self.tables_host[slot] = -1
            self.tables[slot] = -1
            self._slots_host[slot] = -1

    def oldest_kept(self, newest: int) -> int:
        """The oldest position a stream's ring still holds when positions up to `newest` are written
        in one go: in a chunk longer than the ring, older positions would share ring slots with newer
        ones (and are outside every window), so they are not written."""
        return max(0, newest + 1 - (self.width - 1) * self.spec.block_size)

    def host_slots(self, slot: int, positions: np.ndarray) -> np.ndarray:
        """`slot_mapping` for one admitted stream on the host (int64); KeyError for a free slot."""
        if slot not in self._owned:
            raise KeyError(f"cache slot {slot} is not admitted")
        return self._slots_host[slot, positions % self.ring_positions]

    def host_slots_rows(self, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """`host_slots` for many admitted streams at once: row i of `positions` [B, M] belongs to stream
        slot `slots[i]` (one indexing instead of a call per stream)."""
        return self._slots_host[np.asarray(slots)[:, None], positions % self.ring_positions]

    def slot_mapping(self, stream_slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat cache slot (physical_block * block_size + offset) of each (stream slot, position)."""
        bs = self.spec.block_size
        blocks = self.tables[stream_slots.long(), (positions.long() // bs) % self.width].long()
        return blocks * bs + positions.long() % bs
